"""Tests of components/evaluate."""
