"""What a run keeps in the store, and deleting the rest without pulling it from under a reader.

A run writes a checkpoint every iteration and a full train state every few; kept forever they
grow without bound (84 GB an iteration at 7B before this policy). The policy (`retention`
config section, docs/contracts.md "Retention") keeps:

- checkpoint 0, the base (the KL reference, and what a replay from no state starts from);
- the newest `keep_last` checkpoints, and every `milestone_every`-th;
- every checkpoint a stage has still to read: the one generate samples its next iteration with
  (bounded staleness included), and those evaluate has still to score;
- the newest `keep_states` full train states;
- everything else of the run: rollouts, scored rollouts (a resume replays from them; they are
  small), evaluations, reports, logs, and every manifest.

Retiring a checkpoint or state deletes its files and keeps its `_SUCCESS`, rewritten with a
`retired` record: lineage (content digests come from the file list), the planner, `rlvr
report`, the dashboard and the trackers read manifests only and see no difference, and a stage
that needs the files gets a RetiredError naming the artifact and how to get it back.

Deletion is safe against a concurrent reader (a generate worker loading a checkpoint, a rerun,
`rlvr eval --watch`) through two markers in `<run>/status/`:

    reader:  write lease  -> wait while a retiring intent exists -> read the manifest (refuse
             a retired one) -> read the files -> delete lease
    sweeper: write intent -> any live lease? then delete intent, skip -> mark the manifest
             retired -> delete the files -> delete intent

Either the sweeper lists leases after the reader wrote its lease (and skips), or the reader
looks for intents after the sweeper wrote its own (and waits until the manifest says retired).
A lease of a process gone from this host, or older than `retention.lease_ttl_s`, is a crashed
reader's and holds nothing off; an intent older than INTENT_STALE_S a crashed sweeper's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from components.core.commit import RETIRED, SUCCESS, RetiredError, is_retired, read_manifest
from components.core.layout import RunLayout
from components.core.store import Store, StoreError, join

if TYPE_CHECKING:
    from components.core.config import RunConfig

log = logging.getLogger("rlvr.retention")

INTENT_STALE_S = 120.0
"""A retiring intent older than this is a crashed sweeper's: readers stop waiting on it."""


def _key(root: str, uri: str) -> str:
    """`checkpoints/00004` -> `checkpoints-00004`: the marker name of an artifact of the run."""
    rel = uri.rstrip("/")[len(root.rstrip("/")) + 1 :] if uri.startswith(root) else uri
    return rel.strip("/").replace("/", "-")


def _alive(record: dict[str, Any], ttl_s: float, now: float) -> bool:
    """A marker's writer may still be at it: recent enough, and not a process known dead."""
    if now - float(record.get("at", 0.0)) > ttl_s:
        return False
    if record.get("host") == socket.gethostname():
        pid = int(record.get("pid", 0))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    return True


def _records(store: Store, uri: str, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name in store.list_files(uri):
        if "/" in name or not name.startswith(prefix) or not name.endswith(".json"):
            continue
        with contextlib.suppress(StoreError, ValueError):
            out.append((name, json.loads(store.read_text(join(uri, name)))))
    return out


def _marker(who: str) -> dict[str, Any]:
    return {"by": who, "host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}


@contextlib.contextmanager
def reading(
    store: Store, uri: str, who: str = "reader", *, wait_s: float = INTENT_STALE_S
) -> Iterator[dict[str, Any]]:
    """Hold `uri` (a checkpoint or train state) against retention while the block reads its
    files; yields its manifest. Raises RetiredError when its files are gone. A directory
    that is not a run's checkpoint or state (`rlvr eval --checkpoint DIR`) is never retired:
    nothing is written beside it."""
    if not RunLayout.retainable(uri):
        manifest = read_manifest(store, uri)
        if is_retired(manifest):
            raise RetiredError(uri)
        yield manifest
        return
    run = RunLayout.above(uri)
    key = _key(run.root, uri)
    lease = join(run.retention_leases, f"{key}.{uuid.uuid4().hex}.json")
    store.write_text(lease, json.dumps(_marker(who)))
    try:
        intents = run.retention_intents
        t0 = time.monotonic()
        delay = 0.02
        while time.monotonic() - t0 < wait_s:
            now = time.time()
            if not any(
                _alive(r, INTENT_STALE_S, now) for _, r in _records(store, intents, key + ".")
            ):
                break
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        manifest = read_manifest(store, uri)
        if is_retired(manifest):
            raise RetiredError(uri)
        yield manifest
    finally:
        with contextlib.suppress(StoreError):
            store.delete(lease)


def retire(store: Store, uri: str, who: str, *, lease_ttl_s: float, reason: str = "") -> bool:
    """Delete a committed artifact's files and mark its manifest retired, unless a live reader
    holds a lease on it; True when it is (now) retired."""
    run = RunLayout.above(uri)
    key = _key(run.root, uri)
    intent = join(run.retention_intents, f"{key}.{uuid.uuid4().hex}.json")
    store.write_text(intent, json.dumps(_marker(who)))
    try:
        now = time.time()
        readers = [
            r
            for _, r in _records(store, run.retention_leases, key + ".")
            if _alive(r, lease_ttl_s, now)
        ]
        if readers:
            log.info("%s: kept for now, %s is reading it", uri, readers[0].get("by"))
            return False
        manifest = read_manifest(store, uri)
        if not is_retired(manifest):
            manifest[RETIRED] = {"at": time.time(), "by": who, "reason": reason}
            store.write_text(join(uri, SUCCESS), json.dumps(manifest, indent=2))
        for f in store.list_files(uri):
            if f != SUCCESS:
                store.delete(join(uri, f))
        return True
    finally:
        with contextlib.suppress(StoreError):
            store.delete(intent)


@dataclass
class Inventory:
    """What a run's store holds, from three listings: committed checkpoints and train states
    (live: with their files; retired: the manifest alone) and evaluated checkpoints."""

    checkpoints: set[int] = field(default_factory=set)
    retired_checkpoints: set[int] = field(default_factory=set)
    states: set[int] = field(default_factory=set)
    retired_states: set[int] = field(default_factory=set)
    evaluated: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, store: Store, root: str) -> Inventory:
        inv, layout = cls(), RunLayout(root)
        for uri, live, retired in (
            (layout.checkpoints_dir, inv.checkpoints, inv.retired_checkpoints),
            (layout.train_state_dir, inv.states, inv.retired_states),
        ):
            files: dict[int, set[str]] = {}
            for f in store.list_files(uri):
                head, _, rest = f.partition("/")
                if head.isdigit() and rest:
                    files.setdefault(int(head), set()).add(rest)
            for n, names in files.items():
                if SUCCESS in names:
                    (live if names - {SUCCESS} else retired).add(n)
        for f in store.list_files(layout.evals_dir):
            head, _, rest = f.partition("/")
            if head.isdigit() and rest == SUCCESS:
                inv.evaluated.add(int(head))
        return inv


def kept_checkpoints(cfg: RunConfig, inv: Inventory, generated: set[int] | None = None) -> set[int]:
    """The live checkpoints the policy keeps (module doc). `generated`: the iterations whose
    rollouts are committed, asked for only where a checkpoint's fate depends on it."""
    from components.core.warm import eval_checkpoints

    r, k, n = cfg.retention, cfg.train.max_staleness, cfg.run.iterations
    live = sorted(inv.checkpoints)
    keep = {0} | set(live[-r.keep_last :])
    if r.milestone_every:
        keep |= {c for c in live if c % r.milestone_every == 0}
    keep |= {c for c in eval_checkpoints(cfg) if c not in inv.evaluated}
    for c in live:
        # generate of iteration c + k samples with checkpoint c (c > 0)
        j = c + k
        if c > 0 and j < n and (generated is None or j not in generated):
            keep.add(c)
    return keep & set(live)


def to_retire(
    cfg: RunConfig,
    inv: Inventory,
    generated: set[int] | None = None,
    orphans: set[int] | None = None,
) -> tuple[list[int], list[int]]:
    """(checkpoints, train states) the policy would delete now. `orphans`: states whose
    checkpoint was redone since (a resume cannot use them): deleted, and not counted among the
    newest kept."""
    if not cfg.retention.enabled:
        return [], []
    ckpts = sorted(inv.checkpoints - kept_checkpoints(cfg, inv, generated))
    orphans = orphans or set()
    usable = sorted(inv.states - orphans)
    states = sorted(orphans & inv.states) + usable[: -cfg.retention.keep_states]
    return ckpts, sorted(states)


def planned(cfg: RunConfig) -> tuple[list[int], list[int]]:
    """(checkpoints, train states) the policy would retire in the run's store now."""
    from components.core.layout import store_for
    from components.core.warm import is_committed

    store, layout = store_for(cfg), RunLayout.of(cfg)
    inv = Inventory.of(store, layout.root)
    k = cfg.train.max_staleness
    # which of the iterations that decide a checkpoint's fate have their rollouts committed
    asked = {c + k for c in inv.checkpoints if c > 0 and c + k < cfg.run.iterations}
    generated = {j for j in asked if is_committed(store, layout.rollouts(j))}
    return to_retire(cfg, inv, generated, _orphans(store, layout, inv.states))


def _orphans(store: Store, layout, states: set[int]) -> set[int]:
    """The live states that no longer belong to the checkpoint committed at their index (it
    was redone since; components/train/stage.py resumes from none of them)."""
    from components.core.commit import content_digest

    out = set()
    for s in states:
        try:
            recorded = read_manifest(store, layout.train_state(s)).get("stats", {})
            if recorded.get("checkpoint_digest") != content_digest(store, layout.checkpoint(s)):
                out.add(s)
        except StoreError:
            continue
    return out


def sweep(cfg: RunConfig, who: str) -> list[str]:
    """Apply the policy to the run now: retire what it does not keep (skipping anything a
    reader holds). Returns the URIs retired. Safe to run from several workers at once."""
    from components.core.layout import store_for

    if not cfg.retention.enabled:
        return []
    store, layout = store_for(cfg), RunLayout.of(cfg)
    ckpts, states = planned(cfg)
    done = []
    ttl = cfg.retention.lease_ttl_s
    for c in ckpts:
        uri = layout.checkpoint(c)
        if retire(store, uri, who, lease_ttl_s=ttl, reason="retention"):
            done.append(uri)
    for s in states:
        uri = layout.train_state(s)
        if retire(store, uri, who, lease_ttl_s=ttl, reason="retention"):
            done.append(uri)
    if done:
        log.info(
            "retention: deleted the files of %s", ", ".join(_key(layout.root, u) for u in done)
        )
    return done
