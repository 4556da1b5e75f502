"""Tests of manifests/ (kustomize, rendered offline)."""
