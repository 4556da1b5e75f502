"""Tests of components/train."""
