"""Reward-function registry for the verify stage: built-in verifiers and user plugins.

Every verifier, built in or plugged in, is exposed with one signature::

    fn(solution_str, ground_truth, extra_info=None) -> {"score": float, "extracted_answer": ...}

Built-ins live in ``VERIFIERS`` (``"math"``, ``"exact"``). A user reward function is named
by a spec string, ``"package.module:function"`` or ``"path/to/file.py:function"``, and
must have verl's signature ``compute_score(data_source, solution_str, ground_truth,
extra_info)`` returning a float or a dict with a ``"score"`` key; ``load_plugin`` adapts
it to the common form. ``resolve_verifier`` turns any spec into a callable that also
receives ``data_source`` and caches the result per process (the executor's workers use it).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable
from numbers import Real
from typing import Any

from components.verify.math import compute_score as math_compute_score
from components.verify.math import extract_answer

__all__ = [
    "VERIFIERS",
    "PluginVerifier",
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
}


def _valid_names() -> str:
    return ", ".join(repr(n) for n in sorted(VERIFIERS))


def get_verifier(name: str) -> Verifier:
    """Return the verifier called ``name``: a built-in name, or a plugin spec containing
    ``:`` (loaded with ``load_plugin``). Unknown names raise ``ValueError`` listing the
    valid ones."""
    if name in VERIFIERS:
        return VERIFIERS[name]
    if ":" in name:
        return load_plugin(name)
    raise ValueError(f"unknown verifier {name!r}; {_SPEC_HELP.format(names=_valid_names())}")


def _as_finite_score(value: Any, spec: str) -> float:
    if isinstance(value, Real) and not isinstance(value, complex):
        score = float(value)
        if math.isfinite(score):
            return score
    raise ValueError(
        f"reward plugin {spec!r} returned {value!r}; the score must be a finite number"
    )


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
                raise ValueError(
                    f"reward plugin {self.spec!r} returned a dict without a 'score' key: "
                    f"{sorted(out)}"
                )
            extracted = out.get("extracted_answer", out.get("pred"))
            return {
                "score": _as_finite_score(out["score"], self.spec),
                "extracted_answer": None if extracted is None else str(extracted),
            }
        return {"score": _as_finite_score(out, self.spec), "extracted_answer": None}


def _split_spec(spec: str) -> tuple[str, str]:
    target, sep, func = spec.rpartition(":")
    if not sep or not target or not func or not func.isidentifier():
        raise ValueError(
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
        raise ValueError(
            f"verifier spec {spec!r}: file {path!r} does not exist; pass an existing "
            "'path/to/file.py:function' (relative paths are resolved from the working "
            "directory)"
        )
    name = "rlvr_plugin_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    mod_spec = importlib.util.spec_from_file_location(name, path)
    if mod_spec is None or mod_spec.loader is None:
        raise ValueError(f"verifier spec {spec!r}: cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    try:
        mod_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ValueError(
            f"verifier spec {spec!r}: importing {path!r} failed "
            f"({type(exc).__name__}: {exc}); fix the plugin file"
        ) from exc
    return module


def load_plugin(spec: str) -> PluginVerifier:
    """Load a user reward function from ``"package.module:function"`` or
    ``"path/to/file.py:function"`` and adapt it to the registry signature.

    Raises ``ValueError`` naming the spec and the fix when the spec is malformed, the
    module cannot be imported, or the function is missing / not callable.
    """
    target, func = _split_spec(spec)
    if _is_file_target(target):
        module = _load_module_from_file(target, spec)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ValueError(
                f"verifier spec {spec!r}: cannot import module {target!r} "
                f"({type(exc).__name__}: {exc}); install it or add it to PYTHONPATH, or "
                "use 'path/to/file.py:function'"
            ) from exc
        except Exception as exc:
            raise ValueError(
                f"verifier spec {spec!r}: importing module {target!r} failed "
                f"({type(exc).__name__}: {exc}); fix the plugin module"
            ) from exc
    fn = getattr(module, func, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(
            f"verifier spec {spec!r}: {target!r} has no function {func!r}; "
            f"callables defined there: {public}"
        )
    if not callable(fn):
        raise ValueError(f"verifier spec {spec!r}: {target}.{func} is not callable")
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
        raise ValueError(f"unknown verifier {spec!r}: {_SPEC_HELP.format(names=_valid_names())}")
    _RESOLVED[spec] = fn
    return fn
