"""The store the core tests run on: a local directory, and S3 (a moto server, real HTTP)."""

from __future__ import annotations

import pytest

from components.core.store import LocalStore, S3Store


@pytest.fixture(params=["local", "s3"])
def store_root(request, tmp_path):
    if request.param == "local":
        return LocalStore(), str(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return S3Store(), f"s3://{bucket}/prefix"
