"""vLLM's API, checked from its source without installing or importing vLLM (a CUDA-only package).

`check`: with `ast` only, every vLLM name the project's backend uses (imports from `vllm`,
attribute chains on what it gets from vLLM, the keywords of each call, the worker methods it
calls through `collective_rpc`; tests/support/vllm_api/uses.py) is looked up in a release's
source (tests/support/vllm_api/resolve.py), read from its wheel
(tests/support/vllm_api/wheel.py). A name that is missing, or a keyword or argument count a
call does not accept, is an error. `check_version` fetches the members the check needs, round
by round, until it needs none.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.vllm_api.resolve import (
    ClassV,
    FuncV,
    InstV,
    ModuleV,
    Pending,
    Resolver,
    Signature,
    TypeV,
    Unknown,
    _class_body,
    _decorator_name,
    _target,
)
from tests.support.vllm_api.uses import (
    REPO,
    WORKER_CLASS,
    WORKER_CLASS_SET_IN,
    Path_,
    RpcUse,
    Use,
    _parse_file,
    extract,
    show,
)
from tests.support.vllm_api.wheel import WheelSource

#: Uses the backend makes only behind a vLLM version check, as `show(path)`: (first version,
#: first version without it or None). The backend has no version checks now, so none.
VERSION_GATED: dict[str, tuple[str, str | None]] = {}


@dataclass
class Report:
    version: str
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # soft uses that don't resolve
    unresolved: dict[str, str] = field(default_factory=dict)  # path -> why it can't be followed
    checked: int = 0


@dataclass
class Resolution:
    values: list
    missing: str | None = None  # why the path does not exist
    stuck: str | None = None  # why its last name can't be verified either way
    missing_at: Path_ = ()  # the shortest prefix of the path that does not exist


class _Checker:
    def __init__(self, resolver: Resolver) -> None:
        self.r = resolver
        self.memo: dict[Path_, Resolution] = {}

    def resolve(self, path: Path_) -> Resolution:
        """What `path` may be: its values, or why it doesn't exist, or why it can't be told."""
        if path not in self.memo:
            self.memo[path] = self._resolve(path)
        return self.memo[path]

    def _resolve(self, path: Path_) -> Resolution:
        if len(path) == 1:
            mod = self.r.module(path[0])
            if mod is None:
                return Resolution([], f"no {path[0]}", missing_at=path)
            return Resolution([ModuleV(mod.name)])
        prev = self.resolve(path[:-1])
        step, prefix = path[-1], show(path[:-1])
        if prev.missing:
            return prev
        unknown = [v for v in prev.values if isinstance(v, Unknown)]
        known = [v for v in prev.values if not isinstance(v, Unknown)]
        if not known:
            return Resolution(unknown, stuck=prev.stuck or f"{prefix} is {unknown[0].why}")
        out: list = []
        for v in known:
            if step == "()":
                out += self.r.call(v)
            elif step in ("[i]", "[k]"):
                out += self.r.element(v, step)
            else:
                out += self.r.attr(v, step) or []
        if step in ("()", "[i]", "[k]"):
            return Resolution(out)
        if not out:
            owners = ", ".join(sorted({_describe(v) for v in known}))
            if unknown:  # not on what we know it may be; maybe on what we don't
                why = f"not on {owners}; {prefix} may also be {unknown[0].why}"
                return Resolution(unknown, stuck=why)
            return Resolution([], f"{prefix} has no `{step}` ({owners})", missing_at=path)
        if all(isinstance(v, Unknown) and v.unverified for v in out):
            return Resolution(out, stuck=out[0].why)
        return Resolution(out)


def _describe(v) -> str:
    if isinstance(v, InstV):
        return str(v.cls)
    if isinstance(v, ModuleV):
        return f"module {v.name}"
    return str(v)


def check(source, repo: Path = REPO, uses=None, checker: _Checker | None = None) -> Report:
    """The backend's uses of vLLM against `source`. Raises Pending when members it needs are
    not cached yet (`check_version` fetches them and calls again with the same `checker`,
    which keeps what it parsed and resolved)."""
    uses, rpcs, llm_consts = uses or extract(repo)
    checker = checker or _Checker(Resolver(source))
    report = Report(source.version)
    pending: list[str] = []

    def guard(fn):
        try:
            return fn()
        except Pending as p:
            pending.append(str(p))
        except LookupError as e:
            report.errors.append(str(e))

    # paths that are one of several alternatives (`a or b`) of a use that needs one of them
    covered = {p for u in uses if len(u.alternatives) > 1 for p in u.alternatives}
    used = {u.alternatives[0] for u in uses if len(u.alternatives) == 1}
    for u in uses:
        guard(lambda u=u: _check_use(checker, u, report, covered, used))
    guard(lambda: _check_worker_class(source, report))
    guard(lambda: _check_rpcs(checker, repo, rpcs, llm_consts, report))
    if pending:
        raise Pending(", ".join(sorted(set(pending))))
    report.errors = list(dict.fromkeys(report.errors))  # an attribute and its call: one line
    report.checked = len(uses) + len(rpcs)
    return report


def _check_use(
    checker: _Checker, u: Use, report: Report, covered: set[Path_], used: set[Path_]
) -> None:
    if not all(_in_range(report.version, show(p)) for p in u.alternatives):
        return
    results = [checker.resolve(p) for p in u.alternatives]
    names = " or ".join(show(p) for p in u.alternatives)
    if not any(r.values for r in results):
        if (
            len(results) == 1
            and results[0].missing_at in used
            and results[0].missing_at != (u.alternatives[0])
        ):
            return  # reported where the missing prefix itself is used
        whys = "; ".join(r.missing for r in results if r.missing)
        # a lone getattr(x, name, default) is tolerated missing; of `a or b`, one must resolve
        if u.soft and len(u.alternatives) == 1:
            if u.alternatives[0] not in covered:
                report.notes.append(f"{u.where}: {names}: {whys} (optional: getattr default)")
        else:
            report.errors.append(f"{u.where}: {names}: {whys}")
        return
    for p, r in zip(u.alternatives, results, strict=True):
        if r.stuck:
            report.unresolved.setdefault(show(p), f"{u.where}: {r.stuck}")
    if not u.call:
        return
    if u.open_keywords:
        report.unresolved.setdefault(f"{names}(**)", f"{u.where}: keywords from a mapping unread")
    callables = [v for r in results for v in r.values if not isinstance(v, Unknown)]
    if not callables:
        return
    sigs = [checker.r.signature(v) for v in callables]
    where = "; ".join(
        dict.fromkeys(s.where + "".join(f", whose **kwargs go to {w}" for w in s.via) for s in sigs)
    )
    for k in u.keywords:
        if not any(s.accepts_keyword(k) for s in sigs):
            report.errors.append(f"{u.where}: {names}(): no keyword `{k}` in {where}")
    if not u.open_keywords and not any(s.accepts_positional(u.nargs) for s in sigs):
        report.errors.append(
            f"{u.where}: {names}(): {u.nargs} positional arguments; {where} takes "
            f"{max(len(s.positional) for s in sigs)}"
        )
    for k, value in u.literals:
        allowed = None if value is None else _literal_values(checker, callables, k)
        if allowed is not None and value not in allowed:
            report.errors.append(
                f"{u.where}: {names}({k}={value!r}): not one of {sorted(allowed, key=repr)}"
            )


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def _in_range(version: str, shown: str) -> bool:
    if shown not in VERSION_GATED:
        return True
    first, gone = VERSION_GATED[shown]
    v = _release(version)
    return _release(first) <= v and (gone is None or v < _release(gone))


def _literal_values(checker: _Checker, callables: list, keyword: str) -> set | None:
    """The values a Literal-typed parameter `keyword` takes (following forwarded **kwargs to
    the class whose field it is); None when it is not a Literal."""
    r = checker.r
    todo, seen = list(callables), set()
    while todo:
        v = todo.pop()
        if id(v.node) in seen:
            continue
        seen.add(id(v.node))
        if isinstance(v, ClassV):
            for c in r.mro(v)[0]:
                for n in _class_body(c.node):
                    if isinstance(n, ast.AnnAssign) and _target(n.target) == keyword:
                        return _literals(r.instances(c.module, n.annotation))
                    if isinstance(n, ast.FunctionDef) and n.name == "__init__":
                        todo.append(FuncV(c.module, n, c, True))
        elif isinstance(v, FuncV):
            a = v.node.args
            for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if p.arg == keyword:
                    return _literals(r.instances(v.module, p.annotation)) if p.annotation else None
            if a.kwarg is not None:
                for n in ast.walk(v.node):
                    if isinstance(n, ast.Call) and any(
                        k.arg is None and getattr(k.value, "id", None) == a.kwarg.arg
                        for k in n.keywords
                    ):
                        todo += [
                            c
                            for c in r.value(v.module, n.func, {})
                            if isinstance(c, ClassV | FuncV)
                        ]
    return None


def _literals(types: list) -> set | None:
    """The values of a Literal, or of an Enum's members (pydantic configs take a member's
    value for the member); None for any other type."""
    out: set = set()
    for t in types:
        if isinstance(t, TypeV) and t.kind == "literal":
            out |= set(t.args)
        elif isinstance(t, InstV) and _is_enum(t.cls):
            out |= {
                n.value.value
                for n in _class_body(t.cls.node)
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            }
        else:
            return None
    return out or None


def _is_enum(cls: ClassV) -> bool:
    return any(_decorator_name(b).endswith("Enum") for b in cls.node.bases)


def _check_worker_class(source, report: Report) -> None:
    text = source.read(WORKER_CLASS_SET_IN)
    if text is None:
        if WORKER_CLASS_SET_IN in source.files:
            raise Pending(WORKER_CLASS_SET_IN)
        report.errors.append(f"{WORKER_CLASS_SET_IN} is not in the wheel")
    elif f'"{WORKER_CLASS}"' not in text and f"'{WORKER_CLASS}'" not in text:
        report.errors.append(
            f"{WORKER_CLASS_SET_IN} no longer names {WORKER_CLASS}: update WORKER_CLASS "
            "(the class `worker_extension_cls` is mixed into)"
        )


def _check_rpcs(
    checker: _Checker, repo: Path, rpcs: list[RpcUse], llm_consts: dict, report: Report
) -> None:
    """Each `collective_rpc("name", args=...)` names a method of the worker extension class
    given to `vllm.LLM(worker_extension_cls=...)` that takes that many arguments (or, failing
    that, one of vLLM's worker class)."""
    ext = llm_consts.get("worker_extension_cls")
    if ext is None:
        if rpcs:
            report.errors.append("collective_rpc used but no worker_extension_cls given to LLM")
        return
    module, _, name = ext.rpartition(".")
    path = repo / (module.replace(".", "/") + ".py")
    cls = None
    if path.exists():
        tree = _parse_file(path)
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if cls is None:
        report.errors.append(f"worker_extension_cls {ext}: no such class")
        return
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    for rpc in rpcs:
        fn = methods.get(rpc.method)
        if fn is None:
            if not checker.resolve((*WORKER_CLASS.split("."), "()", rpc.method)).values:
                report.errors.append(
                    f"{rpc.file}:{rpc.line}: collective_rpc: {ext} has no {rpc.method} "
                    f"(nor has {WORKER_CLASS})"
                )
            continue
        takes = len(fn.args.args) - 1
        required = takes - len(fn.args.defaults)
        if rpc.nargs is not None and not (required <= rpc.nargs <= takes or fn.args.vararg):
            report.errors.append(
                f"{rpc.file}:{rpc.line}: collective_rpc({rpc.method!r}) passes {rpc.nargs} "
                f"arguments; {ext}.{rpc.method} takes {required} to {takes}"
            )


def fetching(source, fn: Callable[[], object], max_rounds: int = 30):
    """`fn()`, which reads `source`, again after each fetch of the members it lacked (all of
    one round's at once) until it needs none."""
    for _ in range(max_rounds):
        try:
            return fn()
        except Pending:
            if not source.wanted:
                raise
            source.fetch_wanted()
    raise RuntimeError(f"vllm {source.version}: still fetching after {max_rounds} rounds")


def check_version(version: str, cache: Path | None = None, source=None) -> Report:
    """`check` against vllm `version`. Raises SourceUnavailable when its source can't be had
    (no network and not cached)."""
    own = source is None
    source = source or WheelSource(version, cache)
    uses = extract()
    checker = _Checker(Resolver(source))
    try:
        return fetching(source, lambda: check(source, uses=uses, checker=checker))
    finally:
        if own:
            source.close()


def literal_values(source, path: Path_, keyword: str) -> set | None:
    """The values keyword `keyword` of the callable at `path` takes where its type is a
    Literal or an Enum (following forwarded **kwargs); None otherwise."""
    checker = _Checker(Resolver(source))

    def run():
        values = checker.resolve(path).values
        return _literal_values(checker, [v for v in values if not isinstance(v, Unknown)], keyword)

    return fetching(source, run)


def signature(source, path: Path_) -> Signature:
    """The signature of the callable at `path` (the first, if it may be several)."""
    checker = _Checker(Resolver(source))

    def run():
        values = [v for v in checker.resolve(path).values if not isinstance(v, Unknown)]
        if not values:
            raise LookupError(f"{show(path)}: not in vllm {source.version}")
        return checker.r.signature(values[0])

    return fetching(source, run)


def lora_ranks(source) -> set | None:
    """The `max_lora_rank` values vLLM accepts: the Literal it is typed as (newer releases), or
    the `possible_max_ranks` tuple LoRAConfig checks it against (older ones)."""
    typed = literal_values(source, ("vllm", "LLM"), "max_lora_rank")
    if typed is not None:
        return typed
    checker = _Checker(Resolver(source))

    def run():
        for c in checker.resolve(("vllm", "config", "LoRAConfig")).values:
            for n in ast.walk(getattr(c, "node", ast.Pass())):
                if isinstance(n, ast.Assign) and "possible_max_ranks" in map(_target, n.targets):
                    return {
                        e.value for e in getattr(n.value, "elts", []) if isinstance(e, ast.Constant)
                    }
        return None

    return fetching(source, run)


def remove_member(text: str, cls: str, member: str) -> str:
    """Module source `text` without `member` (a method, with its decorators, or a field) of
    class `cls`: a doctored vLLM for the tests."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    for c in ast.walk(tree):
        if isinstance(c, ast.ClassDef) and c.name == cls:
            for n in c.body:
                name = getattr(n, "name", None) or _target(getattr(n, "target", ast.Pass()))
                if name == member:
                    first = min([n.lineno, *(d.lineno for d in getattr(n, "decorator_list", []))])
                    del lines[first - 1 : n.end_lineno]
                    return "".join(lines)
    raise LookupError(f"no {cls}.{member}")
