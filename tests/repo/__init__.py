"""Tests of the repository itself: layers, style, README and docs."""
