"""Tests of pipelines/."""
