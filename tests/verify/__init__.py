"""Tests of components/verify."""
