"""Atomic stage outputs: a directory counts only once its `_SUCCESS` manifest exists.

Protocol (docs/contracts.md, "Commit protocol"):

1. `OutputDir.begin(force)` returns False when `_SUCCESS` already exists and force is off: the
   stage has nothing to do (idempotent rerun). Otherwise it removes `_SUCCESS` first, then
   whatever a crashed earlier attempt left, so partial output is replaced, never mixed.
2. The stage writes its files through `put_file` / `put_bytes`, which record bytes and sha256.
3. `commit(stats, inputs)` writes `_SUCCESS` last: JSON listing every file with its bytes and
   sha256, the stage's stats, and the content digests of the inputs it was computed from.
   Readers (`read_manifest`, `committed_files`, `materialize`) refuse a directory without it;
   `materialize` also checks sizes (local) or sha256 (S3 downloads) against it.

Lineage: `lineage(store, uris, config)` digests each input directory's file list (not its
timestamps or stats) plus the stage's config section. `up_to_date(inputs)` is true only when the
committed output was computed from exactly those inputs, so a rerun after an upstream stage was
redone with different results recomputes, and a rerun with nothing changed skips.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.core.errors import UserError
from components.core.layout import TRAIN_STATE
from components.core.store import Store, StoreError, is_s3, join

SUCCESS = "_SUCCESS"
MANIFEST_VERSION = 1
log = logging.getLogger("rlvr.commit")


class NotCommittedError(StoreError):
    """A reader was pointed at a directory that has no `_SUCCESS` (missing or partial output)."""


RETIRED = "retired"
"""The manifest key of an output whose files the retention policy deleted
(components/core/retention.py): its manifest, and with it its lineage, stays."""


def is_retired(manifest: dict[str, Any]) -> bool:
    return bool(manifest.get(RETIRED))


class RetiredError(UserError):
    """A stage needs the files of a checkpoint or train state the retention policy deleted."""

    def __init__(self, uri: str) -> None:
        from components.core.layout import RunLayout

        number = RunLayout.checkpoint_number(uri)
        if number is not None:
            fix = (
                f"rebuild it with `rlvr stage train CONFIG --run-id ID --iteration "
                f"{number - 1} --force` (it replays from the newest kept train state: the "
                "same bytes where the update is deterministic, as on a CPU), or keep more "
                "(retention.keep_last, retention.milestone_every; retention.enabled: false keeps "
                "everything)"
            )
        else:
            fix = (
                "a resume replays from an older train state or from the base; keep more "
                "with retention.keep_states"
            )
        super().__init__(
            f"{uri} was deleted by the run's retention policy (its manifest is kept, its "
            f"files are not); {fix}"
        )


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class OutputDir:
    """One stage output directory being written."""

    store: Store
    uri: str
    stage: str
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    def is_committed(self) -> bool:
        return self.store.exists(join(self.uri, SUCCESS))

    def up_to_date(self, inputs: dict[str, str]) -> bool:
        """Committed, and computed from exactly these inputs. When it is committed but from
        other inputs, the log says which changed (the reason for recomputing)."""
        if not self.is_committed():
            return False
        stored = read_manifest(self.store, self.uri).get("inputs") or {}
        refuse_older_lineage(self.uri, stored, inputs)
        changed = stale_inputs(stored, inputs)
        if changed:
            log.warning("%s: recomputing, %s", self.uri, "; ".join(changed))
        return not changed

    def begin(self, force: bool = False) -> bool:
        """Prepare to write. False means: already committed, nothing to do."""
        if self.is_committed() and not force:
            return False
        self.store.delete(join(self.uri, SUCCESS))  # uncommit first, then clear
        self.store.delete_tree(self.uri)
        self._sweep_scratch()
        self.files.clear()
        return True

    def _sweep_scratch(self) -> None:
        """Remove scratch directories a killed earlier attempt left beside the output (a local
        store only; see scratch_dir)."""
        if is_s3(self.uri):
            return
        path = Path(self.uri[len("file://") :] if self.uri.startswith("file://") else self.uri)
        if path.parent.is_dir():
            for old in path.parent.glob(f".{path.name}.*.tmp"):
                shutil.rmtree(old, ignore_errors=True)

    def put_file(
        self, local: Path, name: str, *, sha256: str | None = None, move: bool = False
    ) -> str:
        """Add a local file. `sha256`: its digest, already computed as it was written (not read
        again); `move`: moved rather than copied where the store allows (a rename on a local
        store's filesystem)."""
        uri = join(self.uri, name)
        info = {"bytes": local.stat().st_size, "sha256": sha256 or sha256_file(local)}
        if move:
            self.store.move_file(local, uri)
        else:
            self.store.upload_file(local, uri)
        self.files[name] = info
        return uri

    def record(self, name: str, nbytes: int, sha256: str) -> None:
        """List a file another process wrote into the directory (a train rank's own part)."""
        self.files[name] = {"bytes": nbytes, "sha256": sha256}

    def put_bytes(self, data: bytes, name: str) -> str:
        uri = join(self.uri, name)
        self.store.write_bytes(uri, data)
        self.files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        return uri

    def put_tree(self, local_dir: Path, *, move: bool = False) -> None:
        """Add every file under `local_dir`. With `move`, files are moved rather than copied where
        the store allows it (a local store on the same filesystem: a rename, no second write)."""
        for p in sorted(Path(local_dir).rglob("*")):
            if p.is_file():
                name = p.relative_to(local_dir).as_posix()
                if move:
                    info = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
                    self.store.move_file(p, join(self.uri, name))
                    self.files[name] = info
                else:
                    self.put_file(p, name)

    def scratch_dir(self) -> Path:
        """A fresh local directory for building output files: next to the output on a local
        store (same filesystem, so `put_tree(move=True)` renames), else in the system tmp."""
        if is_s3(self.uri):
            return Path(tempfile.mkdtemp(prefix="rlvr-out-"))
        parent = Path(self.uri[len("file://") :] if self.uri.startswith("file://") else self.uri)
        parent.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{parent.name}.", suffix=".tmp", dir=parent.parent))

    def commit(
        self, stats: dict[str, Any] | None = None, inputs: dict[str, str] | None = None
    ) -> dict[str, Any]:
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "stage": self.stage,
            "committed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": [{"path": k, **v} for k, v in sorted(self.files.items())],
            "inputs": inputs or {},
            "stats": stats or {},
        }
        self.store.write_text(join(self.uri, SUCCESS), json.dumps(manifest, indent=2))
        return manifest


def read_manifest(store: Store, uri: str) -> dict[str, Any]:
    """The `_SUCCESS` manifest of a committed directory, or NotCommittedError."""
    success = join(uri, SUCCESS)
    if not store.exists(success):
        raise NotCommittedError(
            f"{uri} is not committed (no {SUCCESS}): the stage that writes it has not finished; "
            "run that stage first"
        )
    return json.loads(store.read_text(success))


def shard_name(shard: int, num_shards: int) -> str:
    return f"shard-{shard:05d}-of-{num_shards:05d}"


def shard_dir(uri: str, shard: int, num_shards: int) -> str:
    """Where shard `shard` of `num_shards` commits (the directory itself when unsharded)."""
    return uri if num_shards == 1 else join(uri, shard_name(shard, num_shards))


def shard_of(key: str, num_shards: int) -> int:
    """The shard a row belongs to, from a stable hash of its key (e.g. its prompt_id)."""
    if num_shards == 1:
        return 0
    return (
        int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") % num_shards
    )


def check_shard(shard: int, num_shards: int) -> None:
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise UserError(
            f"--shard {shard} --num-shards {num_shards}: need num_shards >= 1 and "
            "0 <= shard < num_shards"
        )


def clear_other_layouts(store: Store, uri: str, num_shards: int) -> None:
    """Before writing one layout of `uri` (unsharded, or S shards), remove any other layout."""
    if num_shards == 1:
        return  # OutputDir.begin clears the whole directory
    if store.exists(join(uri, SUCCESS)):  # an unsharded commit: uncommit, then drop its files
        store.delete(join(uri, SUCCESS))
        for f in store.list_files(uri):
            if not f.startswith("shard-"):  # never a sibling shard's files being written now
                store.delete(join(uri, f))
    keep = f"-of-{num_shards:05d}"
    for d in store.list_dirs(uri):
        if d.startswith("shard-") and not d.endswith(keep):
            store.delete_tree(join(uri, d))


def committed_parts(store: Store, uri: str) -> list[str]:
    """The committed directories that make up a stage output: `uri` itself when it has a
    `_SUCCESS`, else all of its `shard-i-of-S/` sub-directories, which must all be committed."""
    if store.exists(join(uri, SUCCESS)):
        return [uri]
    return [join(uri, d) for d in committed_layout(uri, store.list_files(uri))]


def committed_layout(uri: str, files: Iterable[str]) -> list[str]:
    """The committed parts of output `uri` from a listing of it (paths relative to `uri`):
    `[""]` when `uri` itself is committed, else every `shard-i-of-S` of one complete shard
    count. Raises NotCommittedError (nothing or not every shard committed) or StoreError (mixed
    shard counts), as committed_parts does; a caller that lists a whole tree once (the run
    dashboard) uses it per output."""
    shards: dict[int, set[int]] = {}
    for f in files:
        if f == SUCCESS:
            return [""]
        head, _, rest = f.partition("/")
        parts = head.split("-")
        if (
            rest == SUCCESS
            and len(parts) == 4
            and parts[0] == "shard"
            and parts[2] == "of"
            and parts[1].isdigit()
            and parts[3].isdigit()
        ):
            shards.setdefault(int(parts[3]), set()).add(int(parts[1]))
    if len(shards) > 1:
        raise StoreError(f"{uri} mixes shard counts {sorted(shards)}; rerun the stage with --force")
    if not shards:
        raise NotCommittedError(
            f"{uri} is not committed (no {SUCCESS}): the stage that writes it has not finished; "
            "run that stage first"
        )
    ((total, done),) = shards.items()
    missing = sorted(set(range(total)) - done)
    if missing:
        raise NotCommittedError(
            f"{uri}: shards {missing} of {total} are not committed yet; run those shards first"
        )
    return [shard_name(i, total) for i in range(total)]


def content_digest(store: Store, uri: str) -> str:
    """Digest of a committed output's content (its files' paths and sha256s, over all shards)."""
    entries = []
    for part in committed_parts(store, uri):
        prefix = part[len(uri) :].strip("/")
        for f in read_manifest(store, part)["files"]:
            entries.append((f"{prefix}/{f['path']}".strip("/"), f["sha256"]))
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:16]


def _relative(uri: str, root: str | None) -> str:
    root = (root or "").rstrip("/")
    return uri[len(root) + 1 :] if root and uri.startswith(root + "/") else uri


Lineage = dict[str, str]
"""Input digests, what a manifest records: input key (run-relative path) -> digest."""


def config_digest(config: Any) -> str:
    """A short digest of a settings object (pydantic model or JSON-able value)."""
    dumped = config.model_dump_json() if hasattr(config, "model_dump_json") else json.dumps(config)
    return hashlib.sha256(dumped.encode()).hexdigest()[:16]


def lineage(
    store: Store,
    uris: list[str],
    config: Any = None,
    root: str | None = None,
) -> Lineage:
    """Input digests recorded in a manifest: one per input directory, plus the config section.
    Inputs inside the run are keyed by their path relative to the run's ``root``
    (``iterations/00003/rollouts``), so a run copied to another directory, prefix or bucket
    finds its outputs up to date; the digests are of content, not of locations."""
    out = {_relative(uri, root): content_digest(store, uri) for uri in uris}
    if config is not None:
        out["config"] = config_digest(config)
    return out


def with_input(inputs: Lineage, key: str, digest: str) -> Lineage:
    """`inputs` plus one more input digest."""
    return {**inputs, key: digest}


def refuse_older_lineage(uri: str, stored: dict[str, str], inputs: dict[str, str]) -> None:
    """UserError where a manifest records its inputs as an rlvr before this lineage did: an
    input of the run keyed by its absolute URI (now by its path in the run), or the train state
    as an input. This rlvr no longer reads those digests, and recomputing would silently redo a
    finished run."""
    moved = [k for k in stored if any(k.endswith("/" + key) for key in inputs if key not in stored)]
    old = moved + [k for k in stored if k.startswith(TRAIN_STATE + "/")]
    if old:
        raise UserError(
            f"{uri} was committed by an rlvr older than this one's lineage (its manifest "
            f"records inputs {old[:2]}), which this version does not read. Finish or read "
            "the run with the rlvr that wrote it, or start it afresh under a new run.run_id "
            "(or delete the run's directory)."
        )


def stale_inputs(stored: dict[str, str], inputs: dict[str, str]) -> list[str]:
    """Why a committed output no longer matches ``inputs`` (empty: it does): each input that
    is new, changed or gone."""
    changed = []
    for key, digest in inputs.items():
        if key not in stored:
            changed.append(f"input {key} is new")
        elif stored[key] != digest:
            what = "the stage's config" if key == "config" else f"input {key}"
            changed.append(f"{what} changed ({stored[key]} -> {digest})")
    changed += [f"input {k} is gone" for k in stored if k not in inputs]
    return changed


def committed_files(store: Store, uri: str, suffix: str = "") -> list[str]:
    """URIs of the files a committed output lists in its manifest(s), filtered by suffix.

    A sharded output counts only once every shard is committed."""
    out = []
    for part in committed_parts(store, uri):
        manifest = read_manifest(store, part)
        out.extend(join(part, f["path"]) for f in manifest["files"] if f["path"].endswith(suffix))
    return out


def materialize(store: Store, uri: str, cache_root: Path | None = None) -> Path:
    """A local directory holding a committed directory's files, checked against its manifest.

    Local stores are read in place (no copy). S3 directories are downloaded once into a cache keyed
    by the URI and the manifest's content hash, so a re-committed directory is fetched again.
    """
    manifest = read_manifest(store, uri)
    if is_retired(manifest):
        raise RetiredError(uri)
    if not is_s3(uri):
        root = Path(uri[len("file://") :] if uri.startswith("file://") else uri)
        for f in manifest["files"]:
            p = root / f["path"]
            if not p.is_file() or p.stat().st_size != f["bytes"]:
                raise StoreError(f"{p} does not match the manifest of {uri}; rerun with --force")
        return root
    key = hashlib.sha256((uri + json.dumps(manifest["files"])).encode()).hexdigest()[:24]
    cache_root = cache_root or Path(tempfile.gettempdir()) / "rlvr-cache"
    dest = cache_root / key
    if (dest / SUCCESS).is_file():
        return dest
    tmp = Path(tempfile.mkdtemp(dir=cache_root.mkdir(parents=True, exist_ok=True) or cache_root))
    try:
        for f in manifest["files"]:
            local = tmp / f["path"]
            store.download_file(join(uri, f["path"]), local)
            if sha256_file(local) != f["sha256"]:
                raise StoreError(f"{join(uri, f['path'])}: sha256 does not match its manifest")
        (tmp / SUCCESS).write_text(json.dumps(manifest))
        if dest.exists():
            shutil.rmtree(tmp)
        else:
            tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
