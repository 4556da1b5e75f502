"""Standard benchmarks on each evaluated checkpoint, through EleutherAI's lm-evaluation-harness.

An `lm_eval` entry of `data.eval` (`LmEvalSetConfig`) names lm-eval tasks or groups; the evaluate
stage runs them with lm-eval's own task definitions, metrics and model adapter (`HFLM`), so the
numbers are the ones `lm_eval --model hf --model_args pretrained=CHECKPOINT --tasks ...` prints
for the same checkpoint. A warm transformers policy is handed to the adapter as it is loaded
(a LoRA checkpoint as the base with its adapter); a vLLM engine's weights are not reachable by
lm-eval's adapters, so there the checkpoint directory is loaded once more with transformers.

Tasks load their data the way lm-eval does: from the Hugging Face Hub, or, where the Hub is not
reachable, from local files named by a task YAML in `include_path` (lm-eval's own mechanism;
relative `data_files` there are relative to that directory). `check_suites` resolves every task
before a run starts: an unknown name is listed with its closest matches, and a task whose data
is neither local nor reachable is named with the fix.

Results per task: each metric (`acc`, `exact_match`; a filter other than lm-eval's `none` is
appended, `exact_match_strict-match`) with its standard error (`<metric>_stderr`), the task's
version, its few-shot count and sample counts, and lm-eval's version for the whole suite.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.metadata
import logging
import math
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from components.core.config import LmEvalSetConfig, RunConfig
from components.core.errors import Problems, UserError
from components.core.task_files import data_files
from components.model import device_turn

log = logging.getLogger("rlvr.evaluate")

#: lm-eval dataset builders that read files (`dataset_kwargs.data_files`) instead of the Hub.
LOCAL_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "pandas"}
INSTALL_HINT = 'pip install "lm-eval[hf]==0.4.13" (a dependency of rlvr, the images\' version)'


def lm_eval_version() -> str | None:
    try:
        return importlib.metadata.version("lm-eval")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=4)
def task_manager(include_path: str | None, names: tuple[str, ...] = ()) -> Any:
    """lm-eval's index of `include_path`'s tasks alone where it has every one of `names`, else
    with lm-eval's own (indexing its 14k task files takes seconds: once per process)."""
    from lm_eval.tasks import TaskManager

    if include_path is not None:
        own = TaskManager(include_path=include_path, include_defaults=False)
        if set(names) <= set(own.all_tasks):
            return own
    return TaskManager(include_path=include_path)


def _subtasks(tm: Any, name: str, seen: set[str] | None = None) -> list[tuple[str, dict]]:
    """(name, config) of every task `name` runs: itself, a group's members, a tag's tasks, at
    any depth (a task defined in Python has an empty config: nothing to check)."""
    seen = set() if seen is None else seen
    if name in seen:
        return []
    seen.add(name)
    entry = tm.task_index.get(name)
    if entry is None:
        return []
    cfg = entry.cfg or {}
    if entry.cfg is None and entry.tags:  # a tag: the tasks carrying it
        return [t for member in sorted(entry.tags) for t in _subtasks(tm, member, seen)]
    members = cfg.get("task")
    if cfg.get("group") is not None and isinstance(members, list):
        out: list[tuple[str, dict]] = []
        for m in members:
            if isinstance(m, str):
                out += _subtasks(tm, m, seen)
            elif isinstance(m, dict) and isinstance(m.get("task"), str):
                sub = m["task"]  # an inline task config, or a registered one with overrides
                out += _subtasks(tm, sub, seen) if sub in tm.task_index else [(sub, m)]
        return out
    return [(name, cfg)]


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout_s: float = 3.0) -> tuple[bool, str]:
    """Whether the Hugging Face Hub (HF_ENDPOINT, else huggingface.co) takes a connection, and
    why not."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return False, "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True, ""
    except OSError as e:
        return False, f"{host}:{port}: {e.strerror or e}"


def check_suites(
    cfg: RunConfig, problems: Problems, *, inputs: bool = True, for_cluster: bool = False
) -> None:
    """Every suite's tasks resolve and their data can be read; lm-eval is installed. With
    `inputs=False` only the names are resolved; `for_cluster`: data that this machine cannot
    read is a warning (the evaluate pods may reach the Hub, or have the files mounted)."""
    if not cfg.data.lm_eval:
        return
    if lm_eval_version() is None:
        problems.error(
            "data.eval", "lm-eval suites need lm-eval, which is not installed", INSTALL_HINT
        )
        return
    for suite in cfg.data.lm_eval:
        where = f"data.eval[{suite.name}]"
        include = suite.include_path
        if include is not None and not Path(include).is_dir():
            report = problems.warn if for_cluster else problems.error
            report(f"{where}.include_path", f"{include} is not a directory of task YAMLs")
            continue
        tm = task_manager(include, tuple(suite.lm_eval))
        known = set(tm.all_tasks)
        for name in suite.lm_eval:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
                hint = f"; closest: {', '.join(close)}" if close else ""
                problems.error(
                    f"{where}.lm_eval",
                    f"no lm-eval task, group or tag named {name!r}{hint} (lm-eval "
                    f"{lm_eval_version()})",
                    "a custom task goes in a YAML under include_path",
                )
            elif inputs:
                _check_data(where, name, _subtasks(tm, name), include, problems, for_cluster)


def _check_data(
    where: str,
    name: str,
    tasks: list[tuple[str, dict]],
    include: str | None,
    problems: Problems,
    for_cluster: bool,
) -> None:
    """One problem per missing file and per Hub dataset out of reach (a group's 57 tasks over
    one dataset are one problem)."""
    report = problems.warn if for_cluster else problems.error
    hub: dict[str, list[str]] = {}
    for task, cfg in tasks:
        path = cfg.get("dataset_path")
        if path is None or cfg.get("custom_dataset"):
            continue  # built in code by the task itself
        if path in LOCAL_BUILDERS:
            base = Path(include) if include else Path.cwd()
            missing = [f for f in data_files(cfg) if "://" not in f and not (base / f).exists()]
            if missing:
                report(
                    where,
                    f"task {task} reads {missing[0]}, which does not exist",
                    f"relative paths are relative to include_path{'' if include else ' (not set)'}",
                )
        elif not Path(path).expanduser().exists():
            hub.setdefault(path, []).append(task)
    if not hub:
        return
    reachable, why = hub_reachable()
    if reachable:
        return
    for path, names in hub.items():
        if names == [name]:
            who = f"task {name} loads"
        else:
            listed = ", ".join(names[:2]) + (", ..." if len(names) > 2 else "")
            who = f"{name}: {len(names)} task{'s' if len(names) > 1 else ''} ({listed}) load"
        report(
            where,
            f"{who} the dataset {path!r} from the Hugging Face Hub, which is not reachable ({why})",
            "give the task local data with a task YAML in include_path (`dataset_path: json`, "
            "`dataset_kwargs: {data_files: ...}`: lm-eval's own mechanism), or set HF_ENDPOINT "
            "to a reachable mirror",
        )


@contextlib.contextmanager
def _in_dir(path: str | None) -> Iterator[None]:
    """Relative `data_files` of a task directory's YAMLs resolve against that directory."""
    if path is None:
        yield
    else:
        with contextlib.chdir(path):
            yield


def adapter(model: Any, tokenizer: Any, suite: LmEvalSetConfig) -> Any:
    """lm-eval's transformers adapter (`HFLM`) around an already loaded model."""
    from lm_eval.models.huggingface import HFLM

    with _quiet_lm_eval():  # it warns that a loaded model is passed, which is the point here
        return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=suite.batch_size)


def run_on_policy(
    due: list[LmEvalSetConfig], engine: Any, store: Any, uri: str, task: str, label: str
) -> dict[str, Any]:
    """Every suite in `due` on the policy the evaluate stage's engine holds (checkpoint `uri`):
    {suite name: summary}. A copy loaded for a vLLM engine is freed afterwards."""
    out = {}
    model, tokenizer = _policy(engine, store, uri, task)
    try:
        with device_turn.yielding_forwards(model):  # a local run: after generate's and train's
            for suite in due:
                log.info(
                    "evaluate %s: lm-eval %s (%s)", label, suite.name, ", ".join(suite.lm_eval)
                )
                out[suite.name] = run_suite(suite, adapter(model, tokenizer, suite))
    finally:
        del model, tokenizer
        if engine.backend is not None and not hasattr(engine.backend, "model"):
            import torch

            if torch.cuda.is_available():  # the copy loaded beside vLLM's engine
                torch.cuda.empty_cache()
    return out


def _policy(engine: Any, store: Any, uri: str, task: str) -> tuple[Any, Any]:
    """The model and tokenizer lm-eval's transformers adapter wraps: the engine's own
    (transformers backend; a LoRA policy as its PEFT model), else the checkpoint loaded once
    more with transformers, for this checkpoint's suites only (a vLLM engine's weights are out
    of lm-eval's reach; it then needs room beside vLLM's share of the GPU)."""
    backend, tokenizer = engine.backend, engine.tokenizer
    model = getattr(backend, "model", None)
    if model is not None and hasattr(model, "forward"):
        return model, tokenizer
    import torch
    from transformers import AutoTokenizer

    from components.core.retention import reading
    from components.model.adapter import is_adapter_dir
    from components.model.checkpoint import local_checkpoint, model_class

    with reading(store, uri, task):
        ckpt = local_checkpoint(store, uri)
        if is_adapter_dir(ckpt):  # refused by the stage's check() before any work
            raise UserError("lm-eval suites on a LoRA policy need generate.backend: transformers")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        # dtype auto: the checkpoint's own, the sampler's (the policy handoff's dtype)
        model = model_class(ckpt).from_pretrained(ckpt, dtype="auto").to(device).eval()
        return model, AutoTokenizer.from_pretrained(ckpt)


def run_suite(suite: LmEvalSetConfig, lm: Any) -> dict[str, Any]:
    """Run a suite with lm-eval on the adapter `lm`; its summary (see `summarize`)."""
    from lm_eval import simple_evaluate

    t0 = time.perf_counter()
    with _in_dir(suite.include_path), _quiet_lm_eval():
        raw = simple_evaluate(
            model=lm,
            tasks=list(suite.lm_eval),
            num_fewshot=suite.num_fewshot,
            limit=suite.limit,
            task_manager=task_manager(suite.include_path, tuple(suite.lm_eval)),
            apply_chat_template=suite.apply_chat_template,
            fewshot_as_multiturn=suite.fewshot_as_multiturn,
            system_instruction=suite.system_instruction,
            log_samples=False,
            random_seed=suite.seed,
            numpy_random_seed=suite.seed,
            torch_random_seed=suite.seed,
            fewshot_random_seed=suite.seed,
        )
    if raw is None:  # lm-eval returns None on ranks other than 0 (not the case here)
        raise UserError(f"data.eval[{suite.name}]: lm-eval returned no results")
    return {**summarize(raw), "seconds": time.perf_counter() - t0}


@contextlib.contextmanager
def _quiet_lm_eval() -> Iterator[None]:
    """Only lm-eval's errors, and no progress bar from `datasets` per task split: the stage's
    own log says what runs, and lm-eval's request bars show progress."""
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    bars = None
    try:
        from datasets.utils import logging as datasets_logging

        bars = datasets_logging.is_progress_bar_enabled()
        datasets_logging.disable_progress_bar()
    except ImportError:
        pass
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            datasets_logging.enable_progress_bar()


def metric_name(key: str) -> tuple[str, bool] | None:
    """`acc,none` -> (`acc`, False); `acc_stderr,none` -> (`acc`, True); a filter other than
    `none` is appended (`exact_match_strict-match`); None for lm-eval's bookkeeping keys."""
    if "," not in key:
        return None
    metric, flt = key.split(",", 1)
    stderr = metric.endswith("_stderr")
    metric = metric.removesuffix("_stderr")
    return (metric if flt == "none" else f"{metric}_{flt}"), stderr


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's result object as `{version, tasks: {task: {metrics, version, n_shot,
    n_samples, group?}}}`: metrics `{name: value, name_stderr: value}`, numbers only (lm-eval
    writes "N/A" where a stderr is not defined)."""
    tasks: dict[str, Any] = {}
    members = raw.get("group_subtasks") or {}
    groups = set(raw.get("groups") or {}) | set(members)
    parent = {t: g for g, subtasks in members.items() for t in subtasks}
    for task, res in (raw.get("results") or {}).items():
        metrics: dict[str, float] = {}
        for key, value in res.items():
            named = metric_name(key)
            if named is None or not isinstance(value, int | float) or not math.isfinite(value):
                continue  # "N/A" or NaN where lm-eval has no standard error
            name, stderr = named
            metrics[f"{name}_stderr" if stderr else name] = float(value)
        n = (raw.get("n-samples") or {}).get(task) or {}
        tasks[task] = {
            "metrics": dict(sorted(metrics.items())),
            "version": (raw.get("versions") or {}).get(task),
            "n_shot": (raw.get("n-shot") or {}).get(task),
            "n_samples": {k: int(v) for k, v in n.items()},
            **({"group": True} if task in groups else {}),
            **({"parent": parent[task]} if task in parent else {}),
        }
    return {"lm_eval_version": lm_eval_version(), "tasks": dict(sorted(tasks.items()))}
