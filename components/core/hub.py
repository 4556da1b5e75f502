"""Hugging Face Hub models and datasets as run inputs, the way TRL and verl users name them.

``model.base: Qwen/Qwen2.5-0.5B-Instruct`` (or ``hf://Qwen/Qwen2.5-0.5B-Instruct@REV``) and
``data.train: hf://datasets/OWNER/NAME/path/in/repo.parquet@REV`` (also huggingface_hub's own
``hf://datasets/OWNER/NAME@REV/path/in/repo.parquet``; or the bare
``OWNER/NAME/path.parquet``) are downloaded once through ``huggingface_hub`` into its cache
(token: the standard ``HF_TOKEN`` variable; on a cluster from a Secret by reference, see
``cluster.hf_token_secret``), then copied into the run like any local input, so a run stays
self-contained. The revision actually used (the commit hash) is recorded in the input's
``_SUCCESS`` manifest. A bare id is a Hub id only when no local path of that name exists
(relative to the config file): a local directory always wins.

Offline (``HF_HUB_OFFLINE=1``) the cache answers, so a pre-filled cache or mirror directory
(``HF_HUB_CACHE``) serves air-gapped machines and the tests.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from components.core.errors import UserError

PREFIX = "hf://"
_NAME = r"[A-Za-z0-9][\w.-]*"
_MODEL_ID = re.compile(rf"^{_NAME}/{_NAME}(@[\w./-]+)?$")
_DATASET_FILE = re.compile(rf"^{_NAME}/{_NAME}/[\w./-]+\.parquet(@[\w./-]+)?$")


MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja", "*.py"]


class HubError(UserError):
    """A Hub input that cannot be had: names the spec, what failed and the fix."""


@dataclass(frozen=True)
class HubRef:
    repo_type: str  # "model" or "dataset"
    repo_id: str
    filename: str | None  # a file in a dataset repo
    revision: str | None

    @property
    def spec(self) -> str:
        middle = "datasets/" if self.repo_type == "dataset" else ""
        tail = f"/{self.filename}" if self.filename else ""
        rev = f"@{self.revision}" if self.revision else ""
        return f"{PREFIX}{middle}{self.repo_id}{tail}{rev}"


def is_hub(spec: str) -> bool:
    return spec.startswith(PREFIX)


def bare_to_spec(text: str, *, dataset: bool) -> str | None:
    """``hf://...`` for a bare Hub id (``owner/name``, or ``owner/name/file.parquet`` for a
    dataset), else None. The caller has checked that no local path of that name exists."""
    if "://" in text or text.startswith(("/", ".", "~")):
        return None
    if dataset and _DATASET_FILE.match(text):
        return f"{PREFIX}datasets/{text}"
    if not dataset and _MODEL_ID.match(text):
        return f"{PREFIX}{text}"
    return None


def parse(spec: str) -> HubRef:
    if not is_hub(spec):
        raise HubError(f"{spec}: not a Hub spec (hf://OWNER/NAME[@REV] or hf://datasets/...)")
    body = spec[len(PREFIX) :].strip("/")
    parts = body.split("/")
    revision = ""
    if parts[0] == "datasets" and len(parts) >= 3 and "@" in parts[2]:
        # huggingface_hub's own form: hf://datasets/OWNER/NAME@REV/path
        parts[2], _, revision = parts[2].partition("@")
    elif "@" in parts[-1]:
        parts[-1], _, revision = parts[-1].partition("@")
    if parts[0] == "datasets":
        if len(parts) < 4 or not parts[-1].endswith(".parquet"):
            raise HubError(
                f"{spec}: a Hub dataset input names a Parquet file in the repo: "
                "hf://datasets/OWNER/NAME/path/to/file.parquet[@REVISION]"
            )
        return HubRef("dataset", "/".join(parts[1:3]), "/".join(parts[3:]), revision or None)
    if len(parts) != 2:
        raise HubError(f"{spec}: a Hub model is hf://OWNER/NAME[@REVISION]")
    return HubRef("model", "/".join(parts), None, revision or None)


def _revision_of(path: str) -> str:
    """The commit hash in a cache path (``.../snapshots/<hash>/...``)."""
    parts = Path(path).parts
    return parts[parts.index("snapshots") + 1] if "snapshots" in parts else "unknown"


@functools.cache
def materialize(spec: str) -> tuple[str, str]:
    """(local path, commit hash) of a Hub input, downloading it once (cached by
    ``huggingface_hub``; repeated calls in one process return at once)."""
    from huggingface_hub import constants, hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    ref = parse(spec)
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    try:
        if ref.repo_type == "model":
            # what a run keeps: config, weights as safetensors, tokenizer; not pickles or
            # original/ checkpoints (import_checkpoint would drop them after downloading)
            path = snapshot_download(
                ref.repo_id,
                revision=ref.revision,
                cache_dir=cache_dir,
                allow_patterns=MODEL_FILES,
            )
        else:
            path = hf_hub_download(
                ref.repo_id,
                ref.filename,
                repo_type="dataset",
                revision=ref.revision,
                cache_dir=cache_dir,
            )
    # the most specific first: a missing local entry is also an EntryNotFoundError
    except GatedRepoError as e:
        raise HubError(f"{spec}: gated repo; accept its terms and set HF_TOKEN ({e})") from None
    except RepositoryNotFoundError:
        raise HubError(
            f"{spec}: no such repo on the Hub (or it is private: set HF_TOKEN); a local path "
            "of that name does not exist either"
        ) from None
    except RevisionNotFoundError:
        raise HubError(f"{spec}: revision {ref.revision!r} not found") from None
    except LocalEntryNotFoundError as e:
        if constants.HF_HUB_OFFLINE:
            raise HubError(
                f"{spec}: not in the local Hub cache and downloads are off (HF_HUB_OFFLINE=1); "
                "download it once with network, or point HF_HUB_CACHE at a mirror that has it"
            ) from None
        raise HubError(
            f"{spec}: the Hub could not be reached and it is not in the local cache ({e}); "
            "check the network (HF_ENDPOINT for a mirror); no local path of that name exists"
        ) from None
    except EntryNotFoundError:
        raise HubError(f"{spec}: {ref.filename!r} is not a file of {ref.repo_id}") from None
    except (HfHubHTTPError, OSError) as e:
        raise HubError(f"{spec}: download failed ({e})") from None
    return path, _revision_of(path)
