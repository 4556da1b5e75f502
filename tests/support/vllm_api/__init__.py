"""vLLM's API, checked from its source without installing or importing vLLM (a CUDA-only package).

- `wheel`: the `.py` members of a released vLLM wheel, read over HTTP Range requests and
  cached on disk (`WheelSource`).
- `uses`: every vLLM name the project's backend uses, found with `ast` (`extract`).
- `resolve`: what a name is in a release's source (`Resolver`, `Signature`).
- `check`: the uses looked up in that source (`check`, `check_version`).

This re-exports what the tests use.
"""

from tests.support.vllm_api.check import (
    Report,
    check,
    check_version,
    fetching,
    lora_ranks,
    remove_member,
    signature,
)
from tests.support.vllm_api.uses import BACKEND_FILES, REPO, extract, show
from tests.support.vllm_api.wheel import DoctoredSource, SourceUnavailable, WheelSource

__all__ = [
    "BACKEND_FILES",
    "REPO",
    "DoctoredSource",
    "Report",
    "SourceUnavailable",
    "WheelSource",
    "check",
    "check_version",
    "extract",
    "fetching",
    "lora_ranks",
    "remove_member",
    "show",
    "signature",
]
