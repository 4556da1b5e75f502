"""The project side: what the backend uses of vLLM, found with `ast` only (vLLM is not imported).

Every vLLM name the backend modules (`BACKEND_FILES`) use: imports from `vllm`, attribute
chains on what they get from vLLM, the keywords of each call, and the worker methods they call
through `collective_rpc`. These are what the check (tests/support/vllm_api/check.py) looks up
in a release's source.

A use is a path from the `vllm` package: names, "()" for a call's result, "[i]" for an element
got by iterating, "[k]" for one got by subscripting. E.g. `vllm.LLM().generate()[i].outputs`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
#: The backend modules the check reads.
BACKEND_FILES = (
    "components/model/vllm_backend.py",
    "components/model/vllm_worker.py",
)
#: The worker class vLLM mixes `worker_extension_cls` into on CUDA: vllm/platforms/cuda.py sets
#: `parallel_config.worker_cls` to this string when it is "auto" (0.10 to 0.33). `check` fails
#: if the string is no longer in that file, so a move shows instead of passing unnoticed.
WORKER_CLASS = "vllm.v1.worker.gpu_worker.Worker"
WORKER_CLASS_SET_IN = "vllm/platforms/cuda.py"


Path_ = tuple[str, ...]


@dataclass(frozen=True)
class Use:
    file: str
    line: int
    alternatives: tuple[Path_, ...]  # usually one; `a or b` gives two, one must resolve
    soft: bool = False  # got through getattr(x, name, default): the code tolerates its absence
    call: bool = False
    nargs: int = 0
    keywords: tuple[str, ...] = ()
    open_keywords: bool = False  # a **mapping or *sequence the extraction could not read
    literals: tuple[tuple[str, object], ...] = ()  # keyword -> a constant passed

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class RpcUse:
    """`llm.collective_rpc("method", args=(...))`: a worker-extension method the workers run."""

    file: str
    line: int
    method: str
    nargs: int | None


def show(path: Path_) -> str:
    out = ""
    for s in path:
        out += s if s in ("()", "[i]", "[k]") else (f".{s}" if out else s)
    return out


@dataclass
class _Obj:
    """An instance of a class defined in the backend module itself."""

    cls: str


@dataclass
class _Ref:
    path: Path_
    soft: bool = False


@dataclass
class _Alt:
    refs: list[_Ref]


@dataclass
class _Tuple:
    items: list


@dataclass
class _Dict:
    keys: dict[str, object] = field(default_factory=dict)  # key -> its constant, or _Unset


class _Extractor:
    """An abstract interpretation of one backend module, flow-insensitive and just precise
    enough to follow what comes from vLLM through locals, `self` attributes, tuples, `zip` /
    `enumerate` loops, comprehensions and `or`."""

    def __init__(self, file: str, tree: ast.Module, hosts: dict[str, Path_]) -> None:
        self.file, self.tree = file, tree
        self.hosts = hosts  # class name -> the vLLM object `self` also is (worker extensions)
        self.uses: list[Use] = []
        self.rpcs: list[RpcUse] = []
        self.classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        self.attrs: dict[str, dict[str, object]] = {c: {} for c in self.classes}
        self.own: dict[str, set[str]] = {c: self._own(n) for c, n in self.classes.items()}
        self.record = False

    @staticmethod
    def _own(cls: ast.ClassDef) -> set[str]:
        """What a class defines itself: methods, class attributes with a value, attributes it
        assigns on self. A bare annotation (`model_runner: object`) declares the host's."""
        own: set[str] = set()
        for n in cls.body:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(n.name)
            elif isinstance(n, ast.Assign):
                own |= {t.id for t in n.targets if isinstance(t, ast.Name)}
            elif isinstance(n, ast.AnnAssign) and n.value is not None:
                if isinstance(n.target, ast.Name):
                    own.add(n.target.id)
        for n in ast.walk(cls):
            targets = n.targets if isinstance(n, ast.Assign) else [getattr(n, "target", None)]
            for t in _flat(targets):
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    own.add(t.attr)
        return own

    def run(self) -> None:
        # twice: `self.x` set in one method and read in another, in any order
        for self.record in (False, True):
            for node in self.tree.body:
                if isinstance(node, ast.FunctionDef):
                    self._function(node, None, {})
                elif isinstance(node, ast.ClassDef):
                    for m in node.body:
                        if isinstance(m, ast.FunctionDef):
                            self._function(m, node.name, {})

    # -- recording --------------------------------------------------------------------------

    def _use(self, node: ast.AST, refs: list[_Ref], **kw) -> None:
        if self.record and refs:
            self.uses.append(
                Use(
                    self.file,
                    node.lineno,
                    tuple(r.path for r in refs),
                    soft=all(r.soft for r in refs),
                    **kw,
                )
            )

    # -- statements ---------------------------------------------------------------------------

    def _function(self, fn: ast.FunctionDef, cls: str | None, outer: dict) -> None:
        env = dict(outer)
        params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        for i, a in enumerate(params):
            env[a.arg] = None
            if cls is not None and i == 0 and not outer:
                env[a.arg] = _Obj(cls)
            elif isinstance(a.annotation, ast.Name | ast.Constant):
                name = getattr(a.annotation, "id", getattr(a.annotation, "value", None))
                if name in self.classes:
                    env[a.arg] = _Obj(name)
        self._block(fn.body, env, cls)

    def _block(self, stmts: list[ast.stmt], env: dict, cls: str | None) -> None:
        for s in stmts:
            self._stmt(s, env, cls)

    def _stmt(self, s: ast.stmt, env: dict, cls: str | None) -> None:
        if isinstance(s, ast.Import | ast.ImportFrom):
            self._import(s, env)
        elif isinstance(s, ast.Assign):
            value = self._expr(s.value, env)
            for t in s.targets:
                self._bind(t, value, s.value, env)
        elif isinstance(s, ast.AnnAssign | ast.AugAssign):
            if s.value is not None:
                value = self._expr(s.value, env)
                if isinstance(s, ast.AnnAssign):
                    self._bind(s.target, value, s.value, env)
        elif isinstance(s, ast.For | ast.AsyncFor):
            self._bind(s.target, self._elements(self._expr(s.iter, env)), None, env)
            self._block(s.body + s.orelse, env, cls)
        elif isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
            self._function(s, None, env)  # a closure: sees the enclosing locals
        elif isinstance(s, ast.ClassDef):
            for m in s.body:
                if isinstance(m, ast.FunctionDef):
                    self._function(m, None, {**env, "self": None})
        elif isinstance(s, ast.Expr | ast.Return | ast.Raise | ast.Delete | ast.Assert):
            for child in ast.iter_child_nodes(s):
                if isinstance(child, ast.expr):
                    self._expr(child, env)
        else:  # if / while / with / try: their expressions, then their bodies
            for _name, value in ast.iter_fields(s):
                if isinstance(value, ast.expr):
                    self._expr(value, env)
                elif isinstance(value, list):
                    for v in value:
                        if isinstance(v, ast.stmt):
                            self._stmt(v, env, cls)
                        elif isinstance(v, ast.withitem):
                            self._expr(v.context_expr, env)
                        elif isinstance(v, ast.ExceptHandler):
                            self._block(v.body, env, cls)

    def _import(self, s: ast.Import | ast.ImportFrom, env: dict) -> None:
        if isinstance(s, ast.Import):
            for a in s.names:
                if a.name.split(".")[0] == "vllm":
                    if a.asname:
                        env[a.asname] = _Ref(tuple(a.name.split(".")))
                    else:
                        env["vllm"] = _Ref(("vllm",))
                    self._use(s, [_Ref(tuple(a.name.split(".")))])
        elif s.module and s.module.split(".")[0] == "vllm" and not s.level:
            for a in s.names:
                ref = _Ref((*s.module.split("."), a.name))
                env[a.asname or a.name] = ref
                self._use(s, [ref])

    def _bind(self, target: ast.expr, value, node, env: dict) -> None:
        if isinstance(target, ast.Name):
            if isinstance(value, _Dict) and isinstance(env.get(target.id), _Dict):
                env[target.id].keys.update(value.keys)
            else:
                env[target.id] = value
        elif isinstance(target, ast.Tuple | ast.List):
            items = value.items if isinstance(value, _Tuple) else [None] * len(target.elts)
            for t, v in zip(target.elts, items, strict=False):
                self._bind(t, v, None, env)
        elif isinstance(target, ast.Attribute):
            owner = self._expr(target.value, env)
            if isinstance(owner, _Obj) and value is not None:
                self.attrs[owner.cls][target.attr] = value
        elif isinstance(target, ast.Subscript):  # kwargs["key"] = ...
            d = self._expr(target.value, env)
            key = target.slice
            if isinstance(d, _Dict) and isinstance(key, ast.Constant):
                d.keys[key.value] = _const(node)

    def _elements(self, value):
        """What iterating over `value` gives."""
        if isinstance(value, _Ref):
            return _Ref((*value.path, "[i]"), value.soft)
        if isinstance(value, _Tuple):  # zip(...) / enumerate(...)
            return value
        return None

    # -- expressions --------------------------------------------------------------------------

    def _expr(self, e: ast.expr | None, env: dict):
        if e is None:
            return None
        if isinstance(e, ast.Name):
            return env.get(e.id)
        if isinstance(e, ast.Attribute):
            return self._attribute(e, self._expr(e.value, env), e.attr, soft=False)
        if isinstance(e, ast.Call):
            return self._call(e, env)
        if isinstance(e, ast.Subscript):
            value = self._expr(e.value, env)
            self._expr(e.slice, env)
            if isinstance(value, _Ref):
                return _Ref((*value.path, "[k]"), value.soft)
            return None
        if isinstance(e, ast.BoolOp):
            values = [self._expr(v, env) for v in e.values]
            refs = [v for v in values if isinstance(v, _Ref)]
            if isinstance(e.op, ast.Or) and len(refs) > 1:
                return _Alt(refs)
            return refs[0] if refs else None
        if isinstance(e, ast.Tuple | ast.List) and isinstance(e.ctx, ast.Load):
            return _Tuple([self._expr(x, env) for x in e.elts])
        if isinstance(e, ast.Dict):
            for v in [*e.keys, *e.values]:
                self._expr(v, env)
            return _Dict(
                {k.value: _const(v) for k, v in zip(e.keys, e.values, strict=True) if _is_str(k)}
            )
        if isinstance(e, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            inner = dict(env)
            for g in e.generators:
                self._bind(g.target, self._elements(self._expr(g.iter, inner)), None, inner)
                for cond in g.ifs:
                    self._expr(cond, inner)
            for part in ("elt", "key", "value"):
                self._expr(getattr(e, part, None), inner)
            return None
        if isinstance(e, ast.Lambda):
            return None
        for child in ast.iter_child_nodes(e):
            if isinstance(child, ast.expr):
                self._expr(child, env)
        return None

    def _attribute(self, node: ast.AST, owner, name: str, soft: bool):
        if isinstance(owner, _Obj):
            if name in self.own[owner.cls]:
                return self.attrs[owner.cls].get(name)
            host = self.hosts.get(owner.cls)
            if host is None:
                return None
            owner = _Ref(host)
        if isinstance(owner, _Ref):
            ref = _Ref((*owner.path, name), owner.soft or soft)
            self._use(node, [ref])
            return ref
        if isinstance(owner, _Alt):
            refs = [_Ref((*r.path, name), r.soft or soft) for r in owner.refs]
            self._use(node, refs)
            return _Alt(refs)
        return None

    def _call(self, e: ast.Call, env: dict):
        f = e.func
        if isinstance(f, ast.Name) and f.id == "getattr" and len(e.args) >= 2:
            owner = self._expr(e.args[0], env)
            for a in e.args[2:]:
                self._expr(a, env)
            if _is_str(e.args[1]):
                return self._attribute(e, owner, e.args[1].value, soft=len(e.args) > 2)
            return None
        if isinstance(f, ast.Name) and f.id in ("zip", "enumerate") and f.id not in env:
            items = [self._elements(self._expr(a, env)) for a in e.args]
            return _Tuple([None, *items] if f.id == "enumerate" else items)
        if isinstance(f, ast.Name) and f.id == "dict" and f.id not in env and not e.args:
            return _Dict({k.arg: _const(k.value) for k in e.keywords if k.arg})
        # kwargs.update(key=...)
        if isinstance(f, ast.Attribute) and f.attr == "update":
            d = self._expr(f.value, env)
            if isinstance(d, _Dict):
                for k in e.keywords:
                    self._expr(k.value, env)
                    if k.arg:
                        d.keys[k.arg] = _const(k.value)
                return None
        callee = self._expr(f, env)
        for a in e.args:
            self._expr(a, env)
        keywords, open_kw, literals = [], False, []
        for k in e.keywords:
            value = self._expr(k.value, env)
            if k.arg is not None:
                keywords.append(k.arg)
                if isinstance(k.value, ast.Constant):
                    literals.append((k.arg, k.value.value))
            elif isinstance(value, _Dict):
                keywords += list(value.keys)
                literals += [(n, v) for n, v in value.keys.items() if v is not None]
            else:
                open_kw = True
        refs = callee.refs if isinstance(callee, _Alt) else [callee]
        refs = [r for r in refs if isinstance(r, _Ref)]
        if not refs:
            return None
        if any(isinstance(a, ast.Starred) for a in e.args):
            open_kw = True
        self._use(
            e,
            refs,
            call=True,
            nargs=len(e.args),
            keywords=tuple(keywords),
            open_keywords=open_kw,
            literals=tuple((k, v) for k, v in literals if not isinstance(v, _Unset)),
        )
        if refs[0].path[-1] == "collective_rpc" and e.args and _is_str(e.args[0]) and self.record:
            nargs: int | None = 0  # None: an `args` that is not a tuple written out
            for k in e.keywords:
                if k.arg == "args":
                    nargs = len(k.value.elts) if isinstance(k.value, ast.Tuple) else None
            self.rpcs.append(RpcUse(self.file, e.lineno, e.args[0].value, nargs))
        out = [_Ref((*r.path, "()"), r.soft) for r in refs]
        return out[0] if len(out) == 1 else _Alt(out)


class _Unset:
    pass


def _const(node):
    """A constant expression's value (for Literal checks); an `_Unset` otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    return _Unset()


def _flat(targets: list) -> Iterable:
    """Assignment targets, tuples unpacked."""
    for t in targets:
        if isinstance(t, ast.Tuple | ast.List):
            yield from _flat(t.elts)
        else:
            yield t


def _is_str(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def extract(repo: Path = REPO) -> tuple[list[Use], list[RpcUse], dict[str, str]]:
    """Every use of vLLM in the backend files, the `collective_rpc` calls, and the constant
    keyword values given to `vllm.LLM` (its `worker_extension_cls` among them)."""
    uses: list[Use] = []
    rpcs: list[RpcUse] = []
    # which backend class is mixed into vLLM's worker: the LLM(...) call's worker_extension_cls
    backend = _Extractor(BACKEND_FILES[0], _parse_file(repo / BACKEND_FILES[0]), {})
    backend.run()
    llm_consts: dict[str, str] = {}
    for u in backend.uses:
        if u.call and ("vllm", "LLM") in u.alternatives:
            llm_consts.update({k: v for k, v in u.literals if isinstance(v, str)})
    uses += backend.uses
    rpcs += backend.rpcs
    ext = llm_consts.get("worker_extension_cls", "")
    host = (*WORKER_CLASS.split("."), "()")
    for rel in BACKEND_FILES[1:]:
        module = rel.removesuffix(".py").replace("/", ".")
        hosts = {ext.rpartition(".")[2]: host} if ext.rpartition(".")[0] == module else {}
        x = _Extractor(rel, _parse_file(repo / rel), hosts)
        x.run()
        uses += x.uses
        rpcs += x.rpcs
    seen: set = set()
    unique = []
    for u in uses:
        key = (u.file, u.line, u.alternatives, u.call, u.nargs, u.keywords)
        if key not in seen:
            seen.add(key)
            unique.append(u)
    return unique, rpcs, llm_consts


def _parse_file(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))
