"""The vLLM side: what a name is in a given release's source, found with `ast` only.

`Resolver` looks a name up in the source: module-level definitions and re-exports (including
`vllm/__init__.py`'s lazy `MODULE_ATTRS`), classes through their bases, attributes from
annotations and `self.x = ...` assignments, and call signatures (`Signature`: a function's
parameters, a dataclass's or msgspec Struct's fields, and where `**kwargs` is forwarded, e.g.
`LLM.__init__` to `EngineArgs`, the forwarded-to signature). vLLM is CUDA-only, so it is never
installed or imported: the resolver reads members through a source
(tests/support/vllm_api/wheel.py), and raises `Pending` for one that is not fetched yet.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tests.support.vllm_api.uses import _flat, _is_str


class Pending(Exception):
    """A module the resolution needs is in the wheel but not fetched yet."""


@dataclass(frozen=True, eq=False)
class ModuleV:
    name: str


@dataclass(frozen=True, eq=False)
class ClassV:
    module: _Module
    node: ast.ClassDef

    def __str__(self) -> str:
        return f"{self.module.name}.{self.node.name} ({self.module.path}:{self.node.lineno})"

    __repr__ = __str__


@dataclass(frozen=True, eq=False)
class FuncV:
    module: _Module
    node: ast.FunctionDef | ast.AsyncFunctionDef
    owner: ClassV | None = None
    bound: bool = False  # reached through an instance (or a classmethod): no self

    def __str__(self) -> str:
        owner = f"{self.owner.node.name}." if self.owner else ""
        return f"{self.module.name}.{owner}{self.node.name} ({self.module.path}:{self.node.lineno})"

    __repr__ = __str__


@dataclass(frozen=True, eq=False)
class InstV:
    cls: ClassV


@dataclass(frozen=True, eq=False)
class TypeV:
    """A builtin container (kind list, whose args are (element values,), or dict: (keys,
    values)), a Literal (literal: its values) or a type alias used as a value (type)."""

    kind: str
    args: tuple = ()


@dataclass(frozen=True, eq=False)
class Unknown:
    """Something that exists but can't be followed (an external type: str, torch's Module...).
    `unverified`: whether it exists at all can't be told (a class's __getattr__, an external
    base)."""

    why: str
    unverified: bool = False


@dataclass(repr=False)
class _Module:
    name: str
    path: str
    tree: ast.Module
    bindings: dict[str, list[tuple]]
    lazy: dict[str, tuple[str, str]]
    is_package: bool

    def __repr__(self) -> str:
        return f"<module {self.name}>"


_TYPING_OPTIONAL = {"Optional"}
_TYPING_UNION = {"Union"}
_LISTLIKE = {
    "list",
    "List",
    "Sequence",
    "MutableSequence",
    "Iterable",
    "Iterator",
    "Generator",
    "set",
    "Set",
    "frozenset",
    "FrozenSet",
    "AbstractSet",
    "MutableSet",
    "Collection",
    "deque",
    "Deque",
    "AsyncIterator",
    "AsyncGenerator",
    "AsyncIterable",
    "GenericSequence",
}
_DICTLIKE = {
    "dict",
    "Dict",
    "Mapping",
    "MutableMapping",
    "DefaultDict",
    "defaultdict",
    "OrderedDict",
}
_WRAPPERS = {"Annotated", "NotRequired", "Required", "ClassVar", "Final", "ReadOnly"}
#: External bases that add no attributes the backend could be using.
_PLAIN_BASES = {
    "object",
    "ABC",
    "Generic",
    "Protocol",
    "Struct",
    "TypedDict",
    "NamedTuple",
    "Enum",
    "IntEnum",
    "str",
    "int",
    "Exception",
    "RuntimeError",
    "ValueError",
}


class Resolver:
    def __init__(self, source) -> None:
        self.source = source
        self.modules: dict[str, _Module | None] = {}
        self._indexes: dict[int, tuple[dict, dict]] = {}

    # -- modules ------------------------------------------------------------------------------

    def module(self, name: str) -> _Module | None:
        if name in self.modules:
            return self.modules[name]
        base = name.replace(".", "/")
        for path, pkg in ((f"{base}.py", False), (f"{base}/__init__.py", True)):
            if path in self.source.files:
                text = self.source.read(path)
                if text is None:
                    raise Pending(path)
                try:
                    tree = _parse_source(path, text)
                except SyntaxError as e:
                    self.modules[name] = None
                    raise LookupError(f"{path}: unparseable ({e})") from None
                bindings, lazy = _scan_module(tree, name, pkg)
                self.modules[name] = _Module(name, path, tree, bindings, lazy, pkg)
                return self.modules[name]
        self.modules[name] = None
        return None

    def module_attr(self, mod: _Module, name: str, seen=frozenset()) -> list:
        """What `mod.name` is: its bindings (all of them: a name bound in both branches of an
        `if` may be either), a submodule, or a lazy re-export. [] when it is none of these."""
        key = (mod.name, name)
        if key in seen:
            return []
        seen = seen | {key}
        out: list = []
        for b in mod.bindings.get(name, []):
            out += self._binding(mod, b, seen)
        if not out and name in mod.lazy:
            target, attr = mod.lazy[name]
            m = self.module(target)
            out += self.module_attr(m, attr, seen) if m else []
        if not out and mod.is_package:
            sub = self.module(f"{mod.name}.{name}")
            if sub is not None:
                out.append(ModuleV(sub.name))
        if not out:
            for b in mod.bindings.get("*", []):
                m = self.module(b[1])
                if m is not None:
                    out += self.module_attr(m, name, seen)
        return out

    def _binding(self, mod: _Module, b: tuple, seen) -> list:
        kind = b[0]
        if kind == "class":
            return [ClassV(mod, b[1])]
        if kind == "def":
            return [FuncV(mod, b[1])]
        if kind == "module":
            m = self.module(b[1]) if b[1].split(".")[0] == "vllm" else None
            return [ModuleV(m.name)] if m else [Unknown(f"module {b[1]}")]
        if kind == "from":
            if b[1].split(".")[0] != "vllm":
                return [Unknown(f"{b[1]}.{b[2]}")]
            m = self.module(b[1])
            if m is None:
                return []
            got = self.module_attr(m, b[2], seen)
            if not got and m.is_package:
                sub = self.module(f"{m.name}.{b[2]}")
                got = [ModuleV(sub.name)] if sub else []
            return got
        if kind == "value":
            return self.value(mod, b[1], {}, seen)
        if kind == "ann":
            return self.instances(mod, b[1])
        return [Unknown(f"{mod.path}: {kind}")]

    # -- expressions --------------------------------------------------------------------------

    def value(self, mod: _Module, e: ast.expr, local: dict, seen=frozenset()) -> list:
        """What expression `e` evaluates to, in module `mod` with locals `local`."""
        if isinstance(e, ast.Name):
            if e.id in local:
                return local[e.id]
            got = self.module_attr(mod, e.id, seen)
            return got or [Unknown(f"{e.id} (builtin or unbound)")]
        if isinstance(e, ast.Attribute):
            out: list = []
            for v in self.value(mod, e.value, local, seen):
                got = self.attr(v, e.attr)
                out += got if got is not None else []
            return out or [Unknown(ast.unparse(e))]
        if isinstance(e, ast.Call):
            out = []
            for v in self.value(mod, e.func, local, seen):
                out += self.call(v)
            return out
        if isinstance(e, ast.Subscript | ast.BinOp) or (
            isinstance(e, ast.Constant) and e.value is None
        ):
            return [TypeV("type", tuple(self.instances(mod, e)))]
        if isinstance(e, ast.IfExp):
            return self.value(mod, e.body, local, seen) + self.value(mod, e.orelse, local, seen)
        return [Unknown(ast.unparse(e))]

    def _external(self, mod: _Module, e: ast.expr) -> str | None:
        """The name `e` stands for if it is not vLLM's: `Optional` for typing.Optional, `list`
        for the builtin."""
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name):
            binds = mod.bindings.get(e.value.id, [])
            if binds and all(b[0] == "module" and not b[1].startswith("vllm") for b in binds):
                return e.attr
            return None
        if isinstance(e, ast.Name):
            binds = mod.bindings.get(e.id, [])
            if not binds:
                return e.id
            if all(b[0] == "from" and not b[1].startswith("vllm") for b in binds):
                return binds[0][2]
        return None

    def instances(self, mod: _Module, t: ast.expr | None, depth: int = 0) -> list:
        """The values an annotation `t` (in `mod`) says a thing is; [] for None."""
        if t is None or depth > 20:
            return [Unknown("unannotated")]
        if isinstance(t, ast.Constant):
            if t.value is None:
                return []
            if isinstance(t.value, str):
                try:
                    return self.instances(mod, ast.parse(t.value, mode="eval").body, depth + 1)
                except SyntaxError:
                    return [Unknown(t.value)]
            return [Unknown(repr(t.value))]
        if isinstance(t, ast.BinOp) and isinstance(t.op, ast.BitOr):
            return self.instances(mod, t.left, depth + 1) + self.instances(mod, t.right, depth + 1)
        if isinstance(t, ast.Subscript):
            ext = self._external(mod, t.value)
            args = t.slice.elts if isinstance(t.slice, ast.Tuple) else [t.slice]
            if ext in _TYPING_OPTIONAL or ext in _TYPING_UNION:
                return [v for a in args for v in self.instances(mod, a, depth + 1)]
            if ext in _WRAPPERS:
                return self.instances(mod, args[0], depth + 1)
            if ext == "Literal":
                return [
                    TypeV("literal", tuple(a.value for a in args if isinstance(a, ast.Constant)))
                ]
            if ext in _LISTLIKE:
                return [TypeV("list", (tuple(self.instances(mod, args[0], depth + 1)),))]
            if ext in _DICTLIKE and len(args) == 2:
                k, v = (tuple(self.instances(mod, a, depth + 1)) for a in args)
                return [TypeV("dict", (k, v))]
            if ext in ("tuple", "Tuple"):
                items = [v for a in args if not _is_ellipsis(a) for v in self.instances(mod, a)]
                return [TypeV("list", (tuple(items),))]
            if ext is not None:
                return [Unknown(ast.unparse(t))]
            return self.instances(mod, t.value, depth + 1)  # a generic vLLM class: Foo[int]
        if isinstance(t, ast.Name | ast.Attribute):
            ext = self._external(mod, t)
            if ext is not None:
                if ext in _LISTLIKE:
                    return [TypeV("list", ((Unknown(ext),),))]
                return [Unknown(ext)]
            out: list = []
            for v in self.value(mod, t, {}):
                out += self._as_instance(v, depth)
            return out
        return [Unknown(ast.unparse(t))]

    def _as_instance(self, v, depth: int) -> list:
        if isinstance(v, ClassV):
            return [InstV(v)]
        if isinstance(v, TypeV) and v.kind == "type":  # an alias: X = list[...] / A | B
            return list(v.args)
        if isinstance(v, FuncV) and isinstance(v.node, ast.FunctionDef):
            return [Unknown(f"{v} used as a type")]
        return [v if isinstance(v, Unknown) else Unknown(f"{v} as a type")]

    # -- classes ------------------------------------------------------------------------------

    def mro(self, cls: ClassV) -> tuple[list[ClassV], list[str]]:
        """The class and its vLLM bases, depth first, and the external bases met."""
        out: list[ClassV] = []
        external: list[str] = []

        def walk(c: ClassV) -> None:
            if any(c is o or (c.node is o.node) for o in out):
                return
            out.append(c)
            for b in c.node.bases:
                base = b.value if isinstance(b, ast.Subscript) else b
                name = self._external(c.module, base)
                if name is not None:
                    external.append(name)
                    continue
                for v in self.value(c.module, base, {}):
                    if isinstance(v, ClassV):
                        walk(v)
                    else:
                        external.append(ast.unparse(base))

        walk(cls)
        return out, external

    def members(self, cls: ClassV, name: str) -> list[tuple[ClassV, str, object]]:
        """Where `name` is defined on the class or a vLLM base: (class, kind, node) for each
        definition, the nearest class first. kind: def, field (annotated), value, class, or
        self (an assignment to self.name in a method: (method, annotation, value))."""
        classes, _ = self.mro(cls)
        for c in classes:
            body, assigned = self._index(c.node)
            found = [(c, kind, n) for kind, n in body.get(name, [])]
            found = found or [(c, "self", x) for x in assigned.get(name, [])]
            if found:
                return found
        return []

    def _index(self, node: ast.ClassDef) -> tuple[dict, dict]:
        """A class's own names: its body's, and those its methods assign on self."""
        key = id(node)
        if key not in self._indexes:
            body: dict[str, list] = {}
            assigned: dict[str, list] = {}
            for n in _class_body(node):
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    kind = "class" if isinstance(n, ast.ClassDef) else "def"
                    body.setdefault(n.name, []).append((kind, n))
                elif isinstance(n, ast.AnnAssign) and _target(n.target):
                    body.setdefault(n.target.id, []).append(("field", n))
                elif isinstance(n, ast.Assign):
                    for t in _flat(n.targets):
                        if _target(t):
                            body.setdefault(t.id, []).append(("value", n))
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                    for a in ast.walk(n):
                        for attr, ann, value in _self_assignments(a):
                            assigned.setdefault(attr, []).append((n, ann, value))
            self._indexes[key] = (body, assigned)
        return self._indexes[key]

    def attr(self, v, name: str) -> list | None:
        """What `v.name` is; None when it has no such attribute."""
        if isinstance(v, Unknown):
            return [v]
        if isinstance(v, ModuleV):
            mod = self.module(v.name)
            got = self.module_attr(mod, name) if mod else []
            return got or None
        if isinstance(v, TypeV):
            return [Unknown(f"{name} maybe, on a {v.kind}", True)]
        if isinstance(v, FuncV):
            return [Unknown(f"{name} maybe, on function {v.node.name}", True)]
        cls = v.cls if isinstance(v, InstV) else v
        instance = isinstance(v, InstV)
        found = self.members(cls, name)
        if not found:
            if self.members(cls, "__getattr__"):
                return [Unknown(f"{name} maybe, through {cls.node.name}.__getattr__", True)]
            _, external = self.mro(cls)
            extra = [b for b in external if b.split("[")[0].split(".")[-1] not in _PLAIN_BASES]
            return [Unknown(f"{name} maybe, from base {extra[0]}", True)] if extra else None
        out: list = []
        defs = [f for f in found if f[1] == "def"]
        if defs:
            impl = [f for f in defs if not _decorated(f[2], "overload")] or defs
            c, _, fn = impl[-1]
            if _decorated(fn, "property", "cached_property") and instance:
                return self.instances(c.module, fn.returns)
            bound = instance or _decorated(fn, "classmethod")
            if _decorated(fn, "staticmethod"):
                bound = False
            return [FuncV(c.module, fn, c, bound)]
        for c, kind, n in found:
            if kind == "class":
                out.append(ClassV(c.module, n))
            elif kind == "field":
                out += self.instances(c.module, n.annotation) if instance else [Unknown("field")]
            elif kind == "value":
                out += self.value(c.module, n.value, {})
            elif kind == "self":
                fn, ann, value = n
                if ann is not None:
                    out += self.instances(c.module, ann)
                elif value is not None:
                    out += self.value(c.module, value, self._locals(c, fn))
                else:
                    out.append(Unknown(f"{name} (unpacked)"))
        return out or [Unknown(name)]

    def _locals(self, cls: ClassV, fn) -> dict:
        """A method's parameters, as their annotations say."""
        local: dict = {}
        params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        for i, a in enumerate(params):
            if i == 0 and not _decorated(fn, "staticmethod"):
                local[a.arg] = [InstV(cls)]
            elif a.annotation is not None:
                local[a.arg] = self.instances(cls.module, a.annotation)
            else:
                local[a.arg] = [Unknown(a.arg)]
        return local

    def call(self, v) -> list:
        """What calling `v` returns."""
        if isinstance(v, ClassV):
            return [InstV(v)]
        if isinstance(v, FuncV):
            if v.node.returns is None:
                return [Unknown(f"{v.node.name}() unannotated")]
            return self.instances(v.module, v.node.returns)
        if isinstance(v, InstV):
            call = self.attr(v, "__call__")
            return [r for c in call or [] for r in self.call(c)] or [Unknown("__call__")]
        return [Unknown(f"call of {v}")]

    def element(self, v, how: str) -> list:
        """What iterating over (`[i]`) or subscripting (`[k]`) `v` gives."""
        if isinstance(v, TypeV) and v.kind == "list":
            return list(v.args[0])
        if isinstance(v, TypeV) and v.kind == "dict":
            return list(v.args[0] if how == "[i]" else v.args[1])
        if isinstance(v, InstV):
            for dunder in ("__getitem__", "__iter__") if how == "[k]" else ("__iter__",):
                for c, _, fn in [f for f in self.members(v.cls, dunder) if f[1] == "def"]:
                    returns = [fn.returns] if fn.returns is not None else []
                    if not returns:  # an implementation behind @overload: the overloads' types
                        returns = [
                            f.returns
                            for _, k, f in self.members(v.cls, dunder)
                            if k == "def" and _decorated(f, "overload") and f.returns is not None
                        ]
                    out = []
                    for r in returns:
                        got = self.instances(c.module, r)
                        if dunder == "__iter__":
                            got = [e for g in got for e in self.element(g, "[i]")]
                        # a slice's overload gives the class back: not an element
                        out += [
                            g
                            for g in got
                            if not (isinstance(g, InstV) and g.cls.node is v.cls.node)
                        ]
                    if out:
                        return out
            return [Unknown(f"elements of {v.cls.node.name}")]
        return [Unknown(f"elements of {v}")]

    # -- signatures ---------------------------------------------------------------------------

    def signature(self, v, seen=frozenset()) -> Signature:
        if isinstance(v, FuncV):
            return self._func_signature(v, seen)
        if isinstance(v, ClassV):
            classes, external = self.mro(v)
            for c in classes:
                for n in _class_body(c.node):
                    if isinstance(n, ast.FunctionDef) and n.name == "__init__":
                        return self._func_signature(FuncV(c.module, n, c, True), seen)
            return self._field_signature(v, classes, external)
        return Signature(str(v), open=True)

    def _func_signature(self, f: FuncV, seen) -> Signature:
        a = f.node.args
        positional = [p.arg for p in [*a.posonlyargs, *a.args]]
        if f.owner is not None and not _decorated(f.node, "staticmethod") and positional:
            if f.bound or f.node.name == "__init__":
                positional = positional[1:]
        names = {p.arg for p in [*a.args, *a.kwonlyargs]}
        sig = Signature(str(f), positional, names, var_positional=a.vararg is not None, open=False)
        if a.kwarg is not None:
            forwarded = self._forwarded(f, a.kwarg.arg, seen | {id(f.node)})
            if forwarded is None:
                sig.open = True
            else:
                for s in forwarded:
                    sig.keywords |= s.keywords
                    sig.open |= s.open
                    sig.via.append(s.where)
        return sig

    def _forwarded(self, f: FuncV, kwarg: str, seen) -> list[Signature] | None:
        """The signatures `**kwarg` is passed on to inside `f`; None when it goes nowhere we can
        follow (then any keyword may be fine)."""
        out = []
        for n in ast.walk(f.node):
            if not isinstance(n, ast.Call):
                continue
            if not any(
                k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kwarg
                for k in n.keywords
            ):
                continue
            local = self._locals(f.owner, f.node) if f.owner else {}
            callees = self.value(f.module, n.func, local)
            known = [c for c in callees if isinstance(c, FuncV | ClassV)]
            if not known or any(id(getattr(c, "node", None)) in seen for c in known):
                return None
            out += [self.signature(c, seen) for c in known]
        return out or None

    def _field_signature(self, v: ClassV, classes: list[ClassV], external: list[str]) -> Signature:
        bases = {b.split("[")[0].split(".")[-1] for b in external}
        decorated = _decorated(v.node, "dataclass") or any(
            _decorated(c.node, "dataclass") for c in classes
        )
        struct = "Struct" in bases
        if not (decorated or struct or bases & {"TypedDict", "NamedTuple"}):
            return Signature(f"{v} (its constructor is not vLLM's)", open=True)
        fields: list[str] = []
        kw_only = any(
            k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value
            for c in classes
            for k in [*c.node.keywords, *_decorator_keywords(c.node, "dataclass")]
        )
        for c in reversed(classes):
            for n in _class_body(c.node):
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                    if _is_classvar(n.annotation) or _init_false(n.value):
                        continue
                    if n.target.id not in fields:
                        fields.append(n.target.id)
        positional = [] if kw_only or "TypedDict" in bases else fields
        return Signature(str(v), positional, set(fields), open=False)


@dataclass
class Signature:
    where: str
    positional: list[str] = field(default_factory=list)
    keywords: set[str] = field(default_factory=set)
    var_positional: bool = False
    open: bool = False  # takes keywords we can't list (**kwargs that go nowhere we follow)
    via: list[str] = field(default_factory=list)

    def accepts_keyword(self, k: str) -> bool:
        return self.open or k in self.keywords

    def accepts_positional(self, n: int) -> bool:
        return self.open or self.var_positional or n <= len(self.positional)


@functools.lru_cache(maxsize=512)
def _parse_source(path: str, text: str) -> ast.Module:
    """A module's tree, parsed once per text: checks of one release (and its doctored copies)
    share them; nothing here changes a tree."""
    return ast.parse(text, path)


def _scan_module(tree: ast.Module, name: str, pkg: bool):
    bindings: dict[str, list[tuple]] = {}
    lazy: dict[str, tuple[str, str]] = {}
    package = name if pkg else name.rpartition(".")[0]

    def absolute(module: str | None, level: int) -> str:
        if not level:
            return module or ""
        base = package
        for _ in range(level - 1):
            base = base.rpartition(".")[0]
        return f"{base}.{module}" if module else base

    def bind(n: str, b: tuple) -> None:
        bindings.setdefault(n, []).append(b)

    def scan(stmts: Iterable[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, ast.ClassDef):
                bind(s.name, ("class", s))
            elif isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
                bind(s.name, ("def", s))
            elif isinstance(s, ast.Import):
                for a in s.names:
                    if a.asname:
                        bind(a.asname, ("module", a.name))
                    else:
                        bind(a.name.split(".")[0], ("module", a.name.split(".")[0]))
            elif isinstance(s, ast.ImportFrom):
                module = absolute(s.module, s.level)
                for a in s.names:
                    if a.name == "*":
                        bind("*", ("star", module))
                    else:
                        bind(a.asname or a.name, ("from", module, a.name))
            elif isinstance(s, ast.Assign):
                for t in s.targets:
                    if isinstance(t, ast.Name):
                        bind(t.id, ("value", s.value))
                        if isinstance(s.value, ast.Dict):
                            lazy.update(_lazy_table(s.value, absolute))
                    elif isinstance(t, ast.Tuple):
                        for el in t.elts:
                            if isinstance(el, ast.Name):
                                bind(el.id, ("unknown",))
            elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                if s.value is not None and "TypeAlias" in ast.unparse(s.annotation):
                    bind(s.target.id, ("value", s.value))
                else:
                    bind(s.target.id, ("ann", s.annotation))
                if isinstance(s.value, ast.Dict):
                    lazy.update(_lazy_table(s.value, absolute))
            elif isinstance(s, ast.If | ast.Try | ast.With):
                scan(getattr(s, "body", []))
                scan(getattr(s, "orelse", []))
                scan(getattr(s, "finalbody", []))
                for h in getattr(s, "handlers", []):
                    scan(h.body)

    scan(tree.body)
    return bindings, lazy


def _lazy_table(d: ast.Dict, absolute: Callable[[str | None, int], str]) -> dict:
    """A lazy re-export table: {"Name": ".module:attr"} (vllm/__init__.py's MODULE_ATTRS) or
    {"Name": ("module", "attr")}."""
    out = {}
    for k, v in zip(d.keys, d.values, strict=True):
        if not _is_str(k):
            return {}
        if _is_str(v) and ":" in v.value:
            mod, _, attr = v.value.partition(":")
        elif isinstance(v, ast.Tuple) and len(v.elts) == 2 and all(map(_is_str, v.elts)):
            mod, attr = (e.value for e in v.elts)
        else:
            return {}
        level = len(mod) - len(mod.lstrip("."))
        out[k.value] = (absolute(mod.lstrip(".") or None, level), attr)
    return out


def _class_body(node: ast.ClassDef) -> Iterable[ast.stmt]:
    def walk(stmts):
        for s in stmts:
            if isinstance(s, ast.If | ast.Try):
                yield from walk(s.body)
                yield from walk(s.orelse)
            else:
                yield s

    return walk(node.body)


def _target(t: ast.expr) -> str | None:
    return t.id if isinstance(t, ast.Name) else None


def _self_assignments(n: ast.AST) -> Iterable[tuple[str, ast.expr | None, ast.expr | None]]:
    """(name, annotation, value) for each `self.name = ...` that statement `n` makes; the value
    is None where it can't be told (unpacking a call)."""
    if isinstance(n, ast.AnnAssign):
        pairs = [(n.target, n.value)]
    elif isinstance(n, ast.Assign):
        pairs = []
        for t in n.targets:
            if isinstance(t, ast.Tuple | ast.List):
                values = n.value.elts if isinstance(n.value, ast.Tuple | ast.List) else []
                if len(values) != len(t.elts):
                    values = [None] * len(t.elts)
                pairs += list(zip(t.elts, values, strict=True))
            else:
                pairs.append((t, n.value))
    else:
        return
    for t, value in pairs:
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
            yield t.attr, getattr(n, "annotation", None), value


def _decorator_name(d: ast.expr) -> str:
    d = d.func if isinstance(d, ast.Call) else d
    return d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")


def _decorated(node, *names: str) -> bool:
    return any(_decorator_name(d) in names for d in getattr(node, "decorator_list", []))


def _decorator_keywords(node, name: str) -> list[ast.keyword]:
    return [
        k
        for d in node.decorator_list
        if isinstance(d, ast.Call) and _decorator_name(d) == name
        for k in d.keywords
    ]


def _is_classvar(t: ast.expr) -> bool:
    t = t.value if isinstance(t, ast.Subscript) else t
    return (getattr(t, "id", None) or getattr(t, "attr", None)) == "ClassVar"


def _init_false(v: ast.expr | None) -> bool:
    return isinstance(v, ast.Call) and any(
        k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
        for k in v.keywords
    )


def _is_ellipsis(a: ast.expr) -> bool:
    return isinstance(a, ast.Constant) and a.value is Ellipsis
