"""The tests' process: run the test code against stand-ins for the solution's names.

Runs in its own sandbox as ``rlvr_runner.py`` (with ``rlvr_wire.py`` and ``tests.json``);
``main.py`` calls ``main(fd)``. The solution's code is never loaded here. Each name the
solution defined is either plain data (a copy), a module (this process imports its own),
or a ``Remote``: a stand-in whose calls, attributes, items and iteration are queries to
the solution's process, answered with plain data. So every comparison the tests make,
nested in ``def check(candidate)`` or not, compares values built here from plain data; a
``Remote`` itself equals only itself. The verdict is this process's.
"""

import builtins
import os
import sys

import rlvr_wire as wire

_SOCK = None
_MUTABLE = (list, dict, set, bytearray)


class SolutionError(Exception):
    """The solution raised an exception that is not one of Python's built-in ones."""


class _Remote:
    __slots__ = ("_rlvr_ref",)

    def __init__(self, ref):
        object.__setattr__(self, "_rlvr_ref", ref)

    def __call__(self, *args, **kwargs):
        ref = object.__getattribute__(self, "_rlvr_ref")
        sent = list(args)
        answer = _query(
            {
                "op": "call",
                "ref": ref,
                "args": _encode(sent),
                "kwargs": _encode(dict(kwargs)),
            }
        )
        for i, new in answer.get("mutated", {}).items():
            _write_back(sent[int(i)], _decode(new))
        return _decode(answer["value"])

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __setattr__(self, name, value):
        self._ask("setattr", name=name, value=_encode(value))

    def _ask(self, op, **fields):
        ref = object.__getattribute__(self, "_rlvr_ref")
        return _decode(_query(dict(fields, op=op, ref=ref))["value"])

    def __iter__(self):
        it = self._ask("iter")  # an iterator kept in the solution's process
        ref = object.__getattribute__(it, "_rlvr_ref")
        while True:  # a chunk at a time: islice(endless(), 5) stops after one query
            answer = _query({"op": "take", "ref": ref})
            yield from _decode(answer["value"])
            if answer.get("done"):
                return

    def __next__(self):
        ref = object.__getattribute__(self, "_rlvr_ref")
        answer = _query({"op": "next", "ref": ref})
        if answer.get("stop"):
            raise StopIteration
        return _decode(answer["value"])

    def __len__(self):
        return self._ask("len")

    def __bool__(self):
        return self._ask("bool")

    def __str__(self):
        return self._ask("str")

    def __repr__(self):
        return self._ask("repr")

    def __getitem__(self, key):
        return self._ask("getitem", key=_encode(key))

    def __contains__(self, key):
        return self._ask("contains", key=_encode(key))


class _ModuleOrRemote(_Remote):
    """A solution function or class whose name is a standard-library module's: calling it
    calls the solution (``bisect(xs, 3)``), an attribute is the real module's
    (``math.isclose``): a test that uses the module without importing it cannot be
    answered by an object the solution named after it."""

    __slots__ = ("_rlvr_module",)

    def __init__(self, ref, module):
        super().__init__(ref)
        object.__setattr__(self, "_rlvr_module", module)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_rlvr_module"), name)


def _to_ref(value):
    if isinstance(value, _Remote):
        return object.__getattribute__(value, "_rlvr_ref")
    raise TypeError(
        "the test passes a " + type(value).__name__ + " to the solution: only plain data "
        'and the solution\'s own objects cross to its process (set "isolation": '
        '"in_process" on test cases that need more)'
    )


def _stdlib_module(name):
    """This process's own copy of a standard-library module, or None."""
    name = str(name)
    if name.split(".")[0] not in sys.stdlib_module_names:
        return None
    try:
        __import__(name)
    except ImportError:
        return None
    return sys.modules.get(name)


def _from_ref(ref):
    if ref.get("t") == "module":
        module = _stdlib_module(ref.get("v"))
        if module is None:
            raise TypeError("the solution sent a module that is not in the standard library")
        return module
    return _Remote(ref)


def _solution_names(names):
    """The scope the tests run in, from the names the solution defined, and the builtin
    names the solution redefined. Builtin names are never taken (``abs = lambda x: 42``
    at the solution's top level must not decide ``assert f(-3) == abs(-3)``; ``main``
    refuses a test that uses one, see there). A name of a standard-library module is
    this process's own import of that module when the solution bound it to a module or
    to data, and a ``_ModuleOrRemote`` when the solution bound it to a function or a
    class (``def bisect(...)`` is the function under test; ``math.isclose`` is still the
    real one). Anything else is decoded from plain data or stands in for the solution's
    object."""
    scope, shadowed = {}, set()
    for name, value in names.items():
        name = str(name)
        if not name.isidentifier() or name.startswith("__"):
            continue
        if hasattr(builtins, name):
            shadowed.add(name)
            continue
        module = _stdlib_module(name)
        try:
            if type(value) is dict and value.get("t") == "ref" and value.get("call"):
                scope[name] = _Remote(value) if module is None else _ModuleOrRemote(value, module)
            elif module is not None:
                scope[name] = module
            else:
                scope[name] = _decode(value)
        except (TypeError, ValueError, wire.WireError):
            continue
    return scope, shadowed


def _encode(value):
    return wire.encode(value, _to_ref)


def _decode(obj):
    return wire.decode(obj, _from_ref)


def _names_used(code):
    """Every name a compiled test refers to, nested functions included."""
    found = set(code.co_names) | set(code.co_varnames)
    for const in code.co_consts:
        if isinstance(const, type(code)):
            found |= _names_used(const)
    return found


def _write_back(original, new):
    """Mirror an in-place change the solution made to an argument (``a.sort()``)."""
    t = type(original)
    if t is not type(new) or t not in _MUTABLE:
        return
    if t is list or t is bytearray:
        original[:] = new
    else:
        original.clear()
        original.update(new)


def _query(req):
    wire.send(_SOCK, b"Q", req)
    _kind, answer = wire.recv(_SOCK)
    error = answer.get("raise")
    if error is not None:
        raise _exception(error)
    if "missing" in answer:
        raise NameError(str(answer["missing"]))
    return answer


# exceptions that steer Python itself (ending an iteration): from the solution they
# would end a test's all()/filter()/comprehension early, so they arrive as SolutionError
_CONTROL_FLOW = (StopIteration, StopAsyncIteration)


def _exception(error):
    """The exception to raise here for one the solution raised: the first built-in class
    of its MRO (so ``except ValueError`` catches the solution's ``BadInput(ValueError)``),
    else ``SolutionError``."""
    name, base = str(error.get("type")), error.get("base")
    message = str(error.get("message", ""))
    exc_type = getattr(builtins, str(base), None) if base else None
    if (
        isinstance(exc_type, type)
        and issubclass(exc_type, Exception)
        and not issubclass(exc_type, _CONTROL_FLOW)
    ):
        return exc_type(message if name == base else name + ": " + message)
    return SolutionError(name + ": " + message)


def _where(exc):
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<test>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return "" if line is None else " (test line " + str(line) + ")"


def main(fd):
    global _SOCK
    _SOCK = fd
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "tests.json"), encoding="utf-8") as f:
        spec = wire.loads(f.read())
    _kind, ready = wire.recv(_SOCK)
    if "names" not in ready:
        return  # the solution did not load; the caller reports why
    scope = {"__name__": "__main__", "__builtins__": builtins}
    verdict = {"ok": True}
    try:
        names, shadowed = _solution_names(ready["names"])
        scope.update(names)
        setup = compile(spec.get("setup") or "", "<setup>", "exec")
        test = compile(spec["test"], "<test>", "exec")
        clash = sorted(shadowed & (_names_used(setup) | _names_used(test)))
        if clash:
            # which one does the test mean, the solution's or Python's? No way to tell, and
            # either guess can be gamed: refuse, with the fix
            raise NameError(
                "the solution redefines the builtin " + ", ".join(clash) + ", which the "
                'tests use; rename the function under test, or set "isolation": '
                '"in_process" on this test case'
            )
        exec(setup, scope)
        exec(test, scope)
    except AssertionError as exc:
        detail = (": " + str(exc)[:200]) if str(exc) else ""
        verdict = {"ok": False, "error": "assertion failed" + _where(exc) + detail}
    except BaseException as exc:
        text = type(exc).__name__ + ": " + str(exc)[:300]
        verdict = {"ok": False, "error": text + _where(exc)}
    sys.stdout.flush()
    wire.send(_SOCK, b"V", verdict)
