"""Helpers shared by the tests: servers, workers, builders (no tests here)."""
