"""Tests of images/ (the stage images)."""
