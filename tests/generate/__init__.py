"""Tests of components/generate."""
