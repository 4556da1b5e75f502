"""Reward-function registry for the verify stage: built-in verifiers and user plugins.

Every verifier, built in or plugged in, is exposed with one signature::

    fn(solution_str, ground_truth, extra_info=None) -> {"score": float, "extracted_answer": ...}

Built-ins live in ``VERIFIERS`` (``"math"``, ``"exact"``, ``"code"``, ``"format"``). A
user reward function is named by a spec string, ``"package.module:function"`` or
``"path/to/file.py:function"``, and has either verl's signature ``compute_score(data_source,
solution_str, ground_truth, extra_info)`` returning a float or a dict with a ``"score"``
key, or TRL's ``fn(completions, **columns) -> list[float | None]`` (detected from the first
parameter's name, or forced with ``load_plugin(spec, signature="trl")``); ``load_plugin``
adapts either to the common form. ``resolve_verifier`` turns any spec into a callable that
also receives ``data_source`` and caches the result per process (the executor's workers
use it).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import sys
from collections.abc import Callable
from numbers import Real
from typing import Any, Literal

from components.core.errors import UserError
from components.verify.code import score_or_raise as code_score
from components.verify.format import format_score
from components.verify.math import compute_score as math_compute_score
from components.verify.math import extract_answer

__all__ = [
    "VERIFIERS",
    "PluginVerifier",
    "TRLPluginVerifier",
    "Verifier",
    "canonical_spec",
    "exact_match_score",
    "get_verifier",
    "load_plugin",
    "resolve_verifier",
]

Verifier = Callable[..., dict[str, Any]]

_SPEC_HELP = (
    "valid names: {names}; or a plugin spec 'package.module:function' / 'path/to/file.py:function'"
)


def exact_match_score(
    solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Exact string match after extraction.

    The answer is extracted like the math verifier does (``\\boxed{}``, answer phrases,
    ``####``); when no rule fires the stripped full response is used. Both sides are
    compared after ``str.strip()`` only.
    """
    answer, rule = extract_answer(solution_str or "")
    if answer is None:
        answer = (solution_str or "").strip()
    ok = answer.strip() == str(ground_truth).strip()
    return {"score": 1.0 if ok else 0.0, "extracted_answer": answer, "rule": rule}


VERIFIERS: dict[str, Verifier] = {
    "math": math_compute_score,
    "exact": exact_match_score,
    # strict variant: invalid test cases / an unavailable sandbox raise (verifier errors)
    "code": code_score,
    "format": format_score,
}


def _valid_names() -> str:
    return ", ".join(repr(n) for n in sorted(VERIFIERS))


def get_verifier(name: str) -> Verifier:
    """Return the verifier called ``name``: a built-in name, or a plugin spec containing
    ``:`` (loaded with ``load_plugin``). Unknown names raise ``UserError`` (a ``ValueError``)
    listing the valid ones."""
    if name in VERIFIERS:
        return VERIFIERS[name]
    if ":" in name:
        return load_plugin(name)
    raise UserError(f"unknown verifier {name!r}; {_SPEC_HELP.format(names=_valid_names())}")


def _as_finite_score(value: Any, spec: str) -> float:
    if isinstance(value, Real) and not isinstance(value, complex):
        score = float(value)
        if math.isfinite(score):
            return score
    raise UserError(f"reward plugin {spec!r} returned {value!r}; the score must be a finite number")


class PluginVerifier:
    """Adapter from verl's ``compute_score(data_source, solution_str, ground_truth,
    extra_info)`` to the registry form ``(solution_str, ground_truth, extra_info)``.

    ``data_source`` may be passed as a keyword; otherwise ``extra_info["data_source"]``
    (or ``""``) is used.
    """

    def __init__(self, spec: str, fn: Callable[..., Any]) -> None:
        self.spec = spec
        self.fn = fn

    def __repr__(self) -> str:
        return f"PluginVerifier({self.spec!r})"

    def __call__(
        self,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
        *,
        data_source: str | None = None,
    ) -> dict[str, Any]:
        if data_source is None:
            data_source = str((extra_info or {}).get("data_source", ""))
        out = self.fn(data_source, solution_str, ground_truth, extra_info)
        if isinstance(out, dict):
            if "score" not in out:
                raise UserError(
                    f"reward plugin {self.spec!r} returned a dict without a 'score' key: "
                    f"{sorted(out)}"
                )
            extracted = out.get("extracted_answer", out.get("pred"))
            return {
                "score": _as_finite_score(out["score"], self.spec),
                "extracted_answer": None if extracted is None else str(extracted),
            }
        return {"score": _as_finite_score(out, self.spec), "extracted_answer": None}


class TRLPluginVerifier(PluginVerifier):
    """Adapter from TRL's reward-function signature ``fn(completions, **columns) ->
    list[float | None]`` to the registry form, one sample per call.

    The function is called with one-element lists: ``completions=[solution_str]``,
    ``ground_truth=[ground_truth]``, ``data_source=[data_source]``, ``prompts=[...]`` when
    ``extra_info`` has a ``"prompt"``, and one list per ``extra_info`` key (TRL passes the
    dataset's other columns that way). Keywords the function does not accept are left
    out unless it takes ``**kwargs``. Batching several samples into one call is left to
    the caller. The function must return a one-element list; ``None`` (TRL's "does not
    apply to this sample") is an error, as is anything that is not a finite number.
    """

    def __init__(self, spec: str, fn: Callable[..., Any]) -> None:
        super().__init__(spec, fn)
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        self._takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._names = frozenset(
            name
            for name, p in params.items()
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        )

    def __repr__(self) -> str:
        return f"TRLPluginVerifier({self.spec!r})"

    def __call__(
        self,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
        *,
        data_source: str | None = None,
    ) -> dict[str, Any]:
        info = dict(extra_info or {})
        if data_source is None:
            data_source = str(info.get("data_source", ""))
        columns: dict[str, list[Any]] = {k: [v] for k, v in info.items()}
        if "prompt" in info:
            columns["prompts"] = [info["prompt"]]
        columns["ground_truth"] = [ground_truth]
        columns["data_source"] = [data_source]
        columns["completions"] = [solution_str]
        if not self._takes_any:
            columns = {k: v for k, v in columns.items() if k in self._names}
        out = self.fn(**columns)
        if not isinstance(out, list | tuple) or len(out) != 1:
            raise UserError(
                f"TRL reward plugin {self.spec!r} must return a list with one score per "
                f"completion (1 here), got {out!r}"
            )
        if out[0] is None:
            raise UserError(
                f"TRL reward plugin {self.spec!r} returned None for this sample (it does "
                "not apply); map this data_source to a reward function that scores it"
            )
        return {"score": _as_finite_score(out[0], self.spec), "extracted_answer": None}


PluginSignature = Literal["auto", "verl", "trl"]
_TRL_FIRST_PARAMS = frozenset({"completions", "prompts"})


def _detect_signature(fn: Callable[..., Any]) -> Literal["verl", "trl"]:
    """``"trl"`` when the first parameter is named ``completions`` or ``prompts``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return "verl"
    if params and params[0].name in _TRL_FIRST_PARAMS:
        return "trl"
    return "verl"


def _split_spec(spec: str) -> tuple[str, str]:
    target, sep, func = spec.rpartition(":")
    if not sep or not target or not func or not func.isidentifier():
        raise UserError(
            f"invalid verifier spec {spec!r}: expected 'package.module:function' or "
            f"'path/to/file.py:function' ({_SPEC_HELP.format(names=_valid_names())})"
        )
    return target, func


def _is_file_target(target: str) -> bool:
    return target.endswith(".py") or os.sep in target or "/" in target


def canonical_spec(spec: str) -> str:
    """Built-in names unchanged; a file plugin's path made absolute (so that worker
    processes resolve it the same way)."""
    if spec in VERIFIERS or ":" not in spec:
        return spec
    target, func = _split_spec(spec)
    if _is_file_target(target):
        return f"{os.path.abspath(target)}:{func}"
    return spec


def _load_module_from_file(path: str, spec: str) -> Any:
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise UserError(
            f"verifier spec {spec!r}: file {path!r} does not exist; pass an existing "
            "'path/to/file.py:function' (relative paths are resolved from the working "
            "directory)"
        )
    name = "rlvr_plugin_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    mod_spec = importlib.util.spec_from_file_location(name, path)
    if mod_spec is None or mod_spec.loader is None:
        raise UserError(f"verifier spec {spec!r}: cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    try:
        mod_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UserError(
            f"verifier spec {spec!r}: importing {path!r} failed "
            f"({type(exc).__name__}: {exc}); fix the plugin file"
        ) from exc
    return module


def load_plugin(spec: str, signature: PluginSignature = "auto") -> PluginVerifier:
    """Load a user reward function from ``"package.module:function"`` or
    ``"path/to/file.py:function"`` and adapt it to the registry signature.

    ``signature`` says how the function is called: ``"verl"`` (``compute_score(data_source,
    solution_str, ground_truth, extra_info)``), ``"trl"`` (``fn(completions, **columns)``,
    see ``TRLPluginVerifier``) or ``"auto"``: TRL when the first parameter is named
    ``completions`` or ``prompts``, else verl.

    Raises ``UserError`` (a ``ValueError``) naming the spec and the fix when the spec is
    malformed, the module cannot be imported, or the function is missing / not callable.
    """
    if signature not in ("auto", "verl", "trl"):
        raise ValueError(f"signature must be 'auto', 'verl' or 'trl', got {signature!r}")
    target, func = _split_spec(spec)
    if _is_file_target(target):
        module = _load_module_from_file(target, spec)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise UserError(
                f"verifier spec {spec!r}: cannot import module {target!r} "
                f"({type(exc).__name__}: {exc}); install it or add it to PYTHONPATH, or "
                "use 'path/to/file.py:function'"
            ) from exc
        except Exception as exc:
            raise UserError(
                f"verifier spec {spec!r}: importing module {target!r} failed "
                f"({type(exc).__name__}: {exc}); fix the plugin module"
            ) from exc
    fn = getattr(module, func, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise UserError(
            f"verifier spec {spec!r}: {target!r} has no function {func!r}; "
            f"callables defined there: {public}"
        )
    if not callable(fn):
        raise UserError(f"verifier spec {spec!r}: {target}.{func} is not callable")
    kind = _detect_signature(fn) if signature == "auto" else signature
    if kind == "trl":
        return TRLPluginVerifier(spec, fn)
    return PluginVerifier(spec, fn)


# A resolved verifier: (data_source, solution_str, ground_truth, extra_info) -> dict
ResolvedVerifier = Callable[[str, str, str, "dict[str, Any] | None"], dict[str, Any]]
_RESOLVED: dict[str, ResolvedVerifier] = {}


def resolve_verifier(spec: str) -> ResolvedVerifier:
    """Resolve a spec (built-in name or plugin spec) to a callable taking
    ``(data_source, solution_str, ground_truth, extra_info)``; cached per process."""
    fn = _RESOLVED.get(spec)
    if fn is not None:
        return fn
    if spec in VERIFIERS:
        builtin = VERIFIERS[spec]

        def fn(data_source: str, solution_str: str, ground_truth: str, extra_info: Any) -> Any:
            return builtin(solution_str, ground_truth, extra_info)

    elif ":" in spec:
        plugin = load_plugin(spec)

        def fn(data_source: str, solution_str: str, ground_truth: str, extra_info: Any) -> Any:
            return plugin(solution_str, ground_truth, extra_info, data_source=data_source)

    else:
        raise UserError(f"unknown verifier {spec!r}: {_SPEC_HELP.format(names=_valid_names())}")
    _RESOLVED[spec] = fn
    return fn
