"""Tests of components/core."""
