"""Tests of end to end: the CLI and whole runs."""
