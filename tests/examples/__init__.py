"""Tests of examples/."""
