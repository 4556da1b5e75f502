"""The solution's process: run the solution once, then answer queries about it.

Runs in its own sandbox as ``rlvr_server.py`` (with ``rlvr_wire.py``); ``main.py`` calls
``main(fd)`` with the channel's file descriptor. Nothing here decides a verdict: whatever
the solution does to this process (its frames, modules, builtins, stdout, even this file's
functions) can only change the *data* it answers with, which is what any solution chooses
anyway. The tests that judge those answers run in another process.
"""

import builtins
import os
import sys

import rlvr_wire as wire

_MUTABLE = (list, dict, set, bytearray)
_CHUNK = 1024  # items per answer when the tests iterate a solution object
_INLINE_NAME_BYTES = 1 << 16  # a bigger module-level value stays here, behind a reference


class _Objects:
    """Objects the solution's side keeps on behalf of the tests, by id."""

    def __init__(self):
        self.by_id = {}

    def to_ref(self, value):
        if isinstance(value, type(os)):
            return {"t": "module", "v": value.__name__}
        key = id(value)
        self.by_id[key] = value
        return {"t": "ref", "id": key, "type": type(value).__name__, "call": callable(value)}

    def from_ref(self, ref):
        if ref.get("t") == "module":
            raise TypeError("modules cannot be passed to the solution")
        try:
            return self.by_id[ref["id"]]
        except KeyError:
            raise TypeError("unknown object reference") from None

    def encode(self, value):
        return wire.encode(value, self.to_ref, lenient=True)


def _builtin_base(exc_type):
    """The first built-in exception class of ``exc_type``'s MRO (``class BadInput(ValueError)``
    is caught as ``ValueError`` in the tests, as it would be in one interpreter)."""
    for cls in exc_type.__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return None


def _error(exc):
    return {
        "raise": {
            "type": type(exc).__name__,
            "base": _builtin_base(type(exc)),
            "message": str(exc)[:500],
        }
    }


def _find_fn(scope, name):
    fn = scope.get(name)
    if callable(fn):
        return fn
    cls = scope.get("Solution")
    if isinstance(cls, type):
        return getattr(cls(), name, None)
    return None


def _answer(req, scope, objs):
    op = req.get("op")
    decode = wire.decode
    if op == "fn":
        fn = _find_fn(scope, req["name"])
        if not callable(fn):
            return {"missing": "function " + repr(req["name"]) + " not found"}
        args = decode(req["args"], objs.from_ref)
        return {"value": objs.encode(fn(*args))}
    target = objs.from_ref(req["ref"])
    if op == "call":
        args = decode(req["args"], objs.from_ref)
        kwargs = decode(req["kwargs"], objs.from_ref)
        before = {i: objs.encode(a) for i, a in enumerate(args) if type(a) in _MUTABLE}
        result = target(*args, **kwargs)
        mutated = {}
        for i, old in before.items():
            new = objs.encode(args[i])
            if new != old:
                mutated[str(i)] = new
        return {"value": objs.encode(result), "mutated": mutated}
    if op == "getattr":
        return {"value": objs.encode(getattr(target, req["name"]))}
    if op == "setattr":
        setattr(target, req["name"], decode(req["value"], objs.from_ref))
        return {"value": None}
    if op == "iter":  # an iterator over the object, kept here
        return {"value": objs.to_ref(iter(target))}
    if op == "take":  # the next items of such an iterator, a chunk at a time
        items, done = [], False
        for _ in range(_CHUNK):
            try:
                items.append(next(target))
            except StopIteration:
                done = True
                break
        return {"value": objs.encode(items), "done": done}
    if op == "next":
        try:
            return {"value": objs.encode(next(target))}
        except StopIteration:
            return {"stop": True}
    if op == "len":
        return {"value": len(target)}
    if op == "bool":
        return {"value": bool(target)}
    if op == "str":
        return {"value": str(target)}
    if op == "repr":
        return {"value": repr(target)}
    if op == "getitem":
        return {"value": objs.encode(target[decode(req["key"], objs.from_ref)])}
    if op == "contains":
        return {"value": decode(req["key"], objs.from_ref) in target}
    raise ValueError("unknown query " + repr(op)[:40])


def main(fd):
    sys.set_int_max_str_digits(0)  # the solution's own arithmetic, as in a plain interpreter
    sock = fd
    send, recv, R = wire.send, wire.recv, b"R"
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "solution.py"), encoding="utf-8") as f:
        source = f.read()
    objs = _Objects()
    scope = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        exec(compile(source, "solution.py", "exec"), scope)
    except BaseException as exc:
        send(sock, R, {"error": "solution raised " + type(exc).__name__ + ": " + str(exc)[:300]})
        return
    names = {}
    for name, value in list(scope.items()):
        if name.startswith("__"):
            continue
        try:
            names[name] = objs.encode(value)
            if len(wire.dumps(names[name])) > _INLINE_NAME_BYTES:
                names[name] = objs.to_ref(value)  # a big table: read through queries
        except (TypeError, ValueError, RecursionError):
            names[name] = objs.to_ref(value)
    send(sock, R, {"names": names})
    while True:
        try:
            _kind, req = recv(sock)
        except (EOFError, wire.WireError):
            return
        try:
            answer = _answer(req, scope, objs)
        except BaseException as exc:
            answer = _error(exc)
        try:
            send(sock, R, answer)
        except (TypeError, ValueError, RecursionError) as exc:  # an answer JSON refuses
            send(sock, R, _error(exc))
