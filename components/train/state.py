"""The full train state: fp32 masters, Adam moments, step and RNG, sharded by rank, no pickle.

    train_state/<i>/state-0000r-of-0000W.safetensors   rank r's parameters: master.<p>,
                                                       exp_avg.<p>, exp_avg_sq.<p>; rng.torch.<r>
    train_state/<i>/rank-0000r.json                    that file's size and sha256, by its rank
    train_state/<i>/state.json                         step, fingerprint, owners, checkpoint digest

Written every `train.state_every` iterations, at the end of every segment and on a clean stop
(components/train/stage.py), not every iteration: a resume loads the newest and replays the
updates since. Each trainable parameter belongs to one rank (sizes balanced); every rank takes
part in gathering each parameter's master and moments (DeepSpeed's gathers of ZeRO partitions
are collectives) but keeps only its own, and writes them itself, in the background. So no rank
ever holds the whole state, and a 70B policy's 840 GB of masters and moments is written by all
of its ranks at once. Tensors are stored whole, per parameter name, so a state written under one
ZeRO stage or world size is restored under another (resharded as it is read).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from components.core.commit import OutputDir, content_digest
from components.core.errors import UserError
from components.core.store import Store, StoreError, join
from components.core.timing import Timeline
from components.model.weights import Entry, FileInfo, FileWriter, ordered

STATE_VERSION = 2
MOMENTS = ("exp_avg", "exp_avg_sq")
STATE_JSON = "state.json"


class TrainStateError(UserError):
    """A train state that does not belong to this model or cannot be restored."""


def fingerprint(model: torch.nn.Module) -> str:
    """Architecture fingerprint: parameter names and shapes, and the model config's type."""
    h = hashlib.sha256(type(model).__name__.encode())
    for name, p in model.named_parameters():
        shape = tuple(getattr(p, "ds_shape", p.shape))
        h.update(f"{name}:{shape};".encode())
    return h.hexdigest()[:16]


def shard_file(rank: int, world: int) -> str:
    return f"state-{rank:05d}-of-{world:05d}.safetensors"


def rank_record(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters the state holds: those that train (a LoRA run's adapter alone)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def owners(model: torch.nn.Module, world: int) -> dict[str, int]:
    """Which rank writes each trainable parameter: largest first to the rank with the fewest
    bytes so far, the same on every rank."""
    sizes = [
        (n, int(torch.Size(getattr(p, "ds_shape", p.shape)).numel())) for n, p in trainable(model)
    ]
    load = [0] * world
    out: dict[str, int] = {}
    for name, size in sorted(sizes, key=lambda x: (-x[1], x[0])):
        r = min(range(world), key=lambda k: (load[k], k))
        out[name] = r
        load[r] += size
    return out


def _zero_stage(engine) -> int:
    return int(engine.zero_optimization_stage())


def _base_optimizer(engine):
    opt = engine.optimizer
    return getattr(opt, "optimizer", opt)


def _holds_directly(engine, p: torch.nn.Parameter) -> bool:
    """Whether the torch optimizer keys its state on the model's own parameter (fp32 ZeRO-0).
    Otherwise (ZeRO 1-3, bf16's fp32 master copies) DeepSpeed maps it to its flat partitions."""
    opt = _base_optimizer(engine)
    return any(q is p for g in opt.param_groups for q in g["params"])


def _master(engine, p: torch.nn.Parameter) -> torch.Tensor:
    """The parameter's fp32 master, whole: DeepSpeed's under bf16 or ZeRO-3 (a collective),
    else the parameter itself."""
    if engine.bfloat16_enabled() or _zero_stage(engine) == 3:
        from deepspeed.utils import safe_get_full_fp32_param

        value = safe_get_full_fp32_param(p)
        if value is None:
            raise TrainStateError("DeepSpeed exposes no fp32 master; cannot save the state exactly")
        return value
    return p.detach()


def snapshot(engine, rank: int, world: int, own: dict[str, int] | None = None) -> dict:
    """This rank's share of the state after the current step: the masters and moments of the
    parameters it owns (`own`, default `owners`), copied to the CPU, and its RNG. Every rank
    calls it: gathering a partitioned parameter is a collective; each keeps only its own."""
    from deepspeed.utils import safe_get_full_optimizer_state

    model = engine.module
    own = owners(model, world) if own is None else own
    state = _base_optimizer(engine).state
    tensors: dict[str, torch.Tensor] = {}
    for name, p in trainable(model):
        mine = own[name] == rank
        master = _master(engine, p)
        if mine:
            tensors[f"master.{name}"] = master.detach().float().cpu().clone().contiguous()
        for key in MOMENTS:
            if _holds_directly(engine, p):
                value = state.get(p, {}).get(key)
            else:
                value = safe_get_full_optimizer_state(p, key)
            if value is not None and mine:
                tensors[f"{key}.{name}"] = value.detach().float().cpu().clone().contiguous()
    tensors[f"rng.torch.{rank}"] = torch.get_rng_state()
    return tensors


def write_shard(path: Path, tensors: dict[str, torch.Tensor]) -> FileInfo:
    """One rank's tensors as a safetensors file, hashed as it is written."""
    entries = ordered(Entry(k, v.dtype, tuple(v.shape)) for k, v in tensors.items())
    with open(path, "wb") as f:
        w = FileWriter(f, entries, {"format": "pt"})
        for e in entries:
            w.put(e.name, tensors[e.name])
        return w.close()


def meta_json(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, indent=2, sort_keys=True).encode()


class Background:
    """At most one write in flight: `start` waits for the previous one first, `wait` returns once
    it is done and raises its error, if any, in the caller's thread."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def pending(self) -> bool:
        return self._thread is not None

    def start(self, job: Callable[[], None], name: str) -> None:
        self.wait()

        def run() -> None:
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - handed to the next wait()
                self._error = e

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error


def save(
    engine,
    store: Store,
    uri: str,
    *,
    iteration: int,
    step: int,
    checkpoint_uri: str,
    rank: int,
    world: int,
    barrier: Callable[[], None],
    background: Background | None = None,
    wait_s: float = 3600.0,
) -> None:
    """Write the full state after `iteration` updates to `uri`: every rank snapshots its share
    now (collectives), then writes it in the background (`background`: at most one write
    pending) or before returning; rank 0 commits once every rank's file is in. Its lineage is
    that of the checkpoint of the same iteration, whose content digest it records: a resume
    takes it only while that checkpoint is still the one committed."""
    t0 = time.time()
    out = OutputDir(store, uri, "train")
    if rank == 0:
        out.begin(force=True)
    barrier()  # nothing is written into the directory before rank 0 has cleared it
    tensors = snapshot(engine, rank, world)
    manifest = json.loads(store.read_text(join(checkpoint_uri, "_SUCCESS")))
    meta = {
        "state_version": STATE_VERSION,
        "step": step,
        "iteration": iteration,
        "fingerprint": fingerprint(engine.module),
        "zero_stage": _zero_stage(engine),
        "world_size": world,
        "files": [shard_file(r, world) for r in range(world)],
        "checkpoint_digest": content_digest(store, checkpoint_uri),
    }

    def job() -> None:
        _write(out, tensors, meta, rank, world, manifest.get("inputs") or {}, t0, wait_s)

    if background is None:
        job()
    else:
        background.start(job, name=f"train-state-{iteration:05d}")


def _write(
    out: OutputDir,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    rank: int,
    world: int,
    inputs: dict[str, str],
    t0: float,
    wait_s: float,
) -> None:
    """One rank's file and record; rank 0 then waits for the others' records and commits."""
    tmp = out.scratch_dir()
    try:
        name = shard_file(rank, world)
        info = write_shard(tmp / name, tensors)
        nbytes = sum(v.numel() * v.element_size() for v in tensors.values())
        tensors.clear()  # the snapshot's memory goes as soon as its file is written
        out.put_file(tmp / name, name, sha256=info.sha256, move=True)
        record = {"rank": rank, "file": name, "bytes": info.bytes, "sha256": info.sha256}
        record_bytes = json.dumps(record).encode()
        if rank != 0:
            out.store.write_bytes(join(out.uri, rank_record(rank)), record_bytes)
            return
        out.put_bytes(record_bytes, rank_record(0))
        for r in range(1, world):
            raw = _await(out.store, join(out.uri, rank_record(r)), wait_s)
            other = json.loads(raw)
            out.record(rank_record(r), len(raw), hashlib.sha256(raw).hexdigest())
            out.record(other["file"], other["bytes"], other["sha256"])
            nbytes += other["bytes"]
        out.put_bytes(meta_json(meta), STATE_JSON)
        timeline = Timeline("state", meta["iteration"])
        timeline.add("state", t0, time.time())
        out.commit(
            {
                "iteration": meta["iteration"],
                "step": meta["step"],
                "checkpoint_digest": meta["checkpoint_digest"],
                "state_bytes": float(nbytes),
                "timeline": timeline.record(),
            },
            inputs,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _await(store: Store, uri: str, wait_s: float) -> bytes:
    """The bytes of `uri` once another rank has written it."""
    t0 = time.monotonic()
    delay = 0.02
    while True:
        try:
            return store.read_bytes(uri)
        except StoreError:
            if time.monotonic() - t0 > wait_s:
                raise StoreError(
                    f"{uri} never came: a rank did not write its train state"
                ) from None
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)


class StateReader:
    """A committed state's tensors, read one at a time from whichever rank's file holds them
    (memory-mapped: restoring never holds the whole state)."""

    def __init__(self, state_dir: Path, uri: str) -> None:
        from safetensors import safe_open

        from components.model.checkpoint import safetensors_problem

        self.uri = uri
        self.meta = read_meta(Path(state_dir), uri)
        self._files: dict[str, Any] = {}
        self._where: dict[str, str] = {}
        for name in self.meta.get("files", []):
            path = Path(state_dir) / name
            why = safetensors_problem(path) if path.exists() else "is missing"
            if why:
                raise TrainStateError(
                    f"{uri}/{name} {why}; start from an older train state (delete this one's "
                    "_SUCCESS) or start a new run"
                )
            try:
                handle = safe_open(str(path), framework="pt", device="cpu")
            except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
                raise TrainStateError(f"{uri}/{name} cannot be read ({e})") from None
            self._files[name] = handle
            for key in handle.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                self._where[key] = name

    def get(self, key: str) -> torch.Tensor | None:
        name = self._where.get(key)
        return None if name is None else self._files[name].get_tensor(key)

    def close(self) -> None:
        self._files.clear()


def read_meta(state_dir: Path, uri: str) -> dict[str, Any]:
    """A committed state's state.json, checked for its version."""
    try:
        meta = json.loads((Path(state_dir) / STATE_JSON).read_text())
        if not isinstance(meta, dict):
            raise ValueError("it is not a JSON object")
    except (OSError, ValueError) as e:
        raise TrainStateError(
            f"{uri}/{STATE_JSON} is not valid train state ({e}); delete its _SUCCESS so a "
            "resume replays from an older state"
        ) from None
    if meta.get("state_version") != STATE_VERSION:
        raise TrainStateError(
            f"{uri}: state_version {meta.get('state_version')} is not supported (this rlvr "
            f"reads {STATE_VERSION}); a resume replays from an older state or the base"
        )
    return meta


def check_fingerprint(model: torch.nn.Module, meta: dict[str, Any], source: str) -> None:
    if meta.get("fingerprint") != fingerprint(model):
        raise TrainStateError(
            f"{source}: the train state was written for a different architecture "
            f"(fingerprint {meta.get('fingerprint')} != {fingerprint(model)}); it does not belong "
            "to this run's model"
        )


def load_masters(model: torch.nn.Module, reader: StateReader) -> None:
    """The fp32 masters into a model's trainable parameters, before DeepSpeed wraps it."""
    check_fingerprint(model, reader.meta, reader.uri)
    with torch.no_grad():
        for name, p in trainable(model):
            value = reader.get(f"master.{name}")
            if value is None:
                raise TrainStateError(
                    f"{reader.uri}: no master weights for parameter {name!r}; the train state "
                    "is incomplete (delete its _SUCCESS so a resume replays from an older one)"
                )
            p.data.copy_(value.to(device=p.device, dtype=p.dtype))


def restore(engine, reader: StateReader, rank: int = 0) -> int:
    """Adam moments, step and RNG into a fresh engine; returns the step count.

    Every trainable parameter must have both moments once `step > 0`: a state that silently
    restarted Adam would train differently from one continuous run."""
    from deepspeed.utils import safe_set_full_optimizer_state

    model = engine.module
    meta, source = reader.meta, reader.uri
    check_fingerprint(model, meta, source)
    step = int(meta["step"])
    opt = _base_optimizer(engine)
    # ZeRO-1/2 link each parameter to its slice of the flat optimizer state lazily (at the first
    # step, or when DeepSpeed loads its own checkpoints); link now so the moments can be set.
    # The torch optimizer creates its state at the first step; create the zero moments it would
    # (on DeepSpeed's flat fp32 partitions too) so they can be overwritten with the saved ones.
    # ZeRO-3 keeps its fp32 flat partitions out of param_groups between steps; with a frozen
    # base (model.lora) their state is not created up front either.
    flats = list(getattr(engine.optimizer, "fp32_partitioned_groups_flat", []))
    for q in [*(q for g in opt.param_groups for q in g["params"]), *flats]:
        st = opt.state[q]
        for key in MOMENTS:
            st.setdefault(key, torch.zeros_like(q, memory_format=torch.preserve_format))
        st.setdefault("step", torch.tensor(0.0))
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:
        engine.optimizer._hp_optimizer_states_linked = False
        link()
    for name, p in trainable(model):
        for key in MOMENTS:
            value = reader.get(f"{key}.{name}")
            if value is None:
                if step > 0:
                    raise TrainStateError(
                        f"{source}: no {key} for parameter {name!r} after {step} steps; the "
                        "train state is incomplete (delete its _SUCCESS so a resume replays "
                        "from an older one)"
                    )
                continue
            if _holds_directly(engine, p):
                opt.state[p][key] = value.to(device=p.device, dtype=torch.float32).clone()
            else:
                safe_set_full_optimizer_state(p, value.to(torch.float32), key)
    # torch's Adam keeps a per-parameter step tensor; it drives bias correction.
    for st in opt.state.values():
        if "exp_avg" in st:
            st["step"] = torch.tensor(float(step), dtype=torch.float32)
    same_world = int(meta.get("world_size", 1)) == _world()
    rng = reader.get(f"rng.torch.{rank if same_world else 0}")
    if rng is not None:
        torch.set_rng_state(rng.to(torch.uint8))
    return step


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1
