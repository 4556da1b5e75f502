"""The code verifier's wire format: framed messages and a codec for plain data.

Stdlib only and self-contained: the parent imports it as
``components.verify.code.harness.wire``, and each sandbox gets a copy as ``rlvr_wire.py``
next to its ``main.py``.

Frames: one byte of kind, four bytes of big-endian length, a JSON payload (over the
channel's raw file descriptor: no ``socket`` module, whose import would add to every
sandbox's start-up).

* ``R`` from the solution's process: its ready message or the answer to a query;
* ``Q`` from the test runner: a query for the solution's process (a call, an attribute);
* ``V`` from the test runner: the verdict.

Values: JSON ``null``/booleans/numbers/strings are themselves, a JSON array is a
``list``, and every JSON object is tagged: ``{"t": tag, "v": ...}`` for ``tuple``,
``set``, ``frozenset``, ``dict`` (``v``: ``[[key, value], ...]``), ``bytes`` and
``bytearray`` (hex), ``complex`` (``[re, im]``), ``fraction`` (``[num, den]``),
``decimal`` (its string), ``int`` (hex, for integers beyond 4000 decimal digits), ``module`` (a module *name*: the receiver imports its own copy),
and ``ref`` (``{"t": "ref", "id": n, "type": name, "call": bool}``: an object that stays
in the solution's process and is reached through further queries). Decoding builds only
those types: nothing in a message can run code in the receiver.
"""

import os
import sys

MAX_DEPTH = 200
_BIG_INT_BITS = 4000 * 3  # under Python's 4300-digit limit for decimal strings
HEADER = 5  # kind (1 byte) + length (4 bytes, big-endian)
_SCALARS = (type(None), bool, int, float, str)


class WireError(Exception):
    """A malformed frame or value."""


def _codec():
    """(dumps, loads) for JSON. Every sandboxed run pays its interpreter's start-up and
    ``import json`` is a large part of it (it pulls in ``re``), so the C accelerator
    ``_json`` is used directly where it has the interface this code is written against;
    otherwise the ``json`` package."""
    try:
        import _json

        def _constant(name):
            return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]

        class _Context:
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            parse_constant = staticmethod(_constant)
            memo = {}

        scanner = _json.make_scanner(_Context())

        def _default(obj):
            raise TypeError("not JSON: " + type(obj).__name__)

        encoder = _json.make_encoder(
            None, _default, _json.encode_basestring_ascii, None, ":", ",", False, False, True
        )

        def dumps(obj):
            return "".join(encoder(obj, 0))

        def loads(text):
            obj, end = scanner(text, 0)
            if text[end:].strip():
                raise ValueError("extra data after the value")
            return obj

        if loads(dumps([1, 2.5, "x", {"k": None}, True])) == [1, 2.5, "x", {"k": None}, True]:
            return dumps, loads
    except Exception:  # any other interface: the package
        pass
    import json

    return (lambda obj: json.dumps(obj, separators=(",", ":"))), json.loads


dumps, loads = _codec()


def send(fd, kind, obj):
    data = dumps(obj).encode("utf-8")
    view = memoryview(kind + len(data).to_bytes(4, "big") + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("channel closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(fd):
    head = _read_exact(fd, HEADER)
    size = int.from_bytes(head[1:], "big")
    try:
        return head[:1], loads(_read_exact(fd, size).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise WireError("unreadable message: " + str(exc)[:80]) from None


def encode(value, to_ref, lenient=False, depth=0):
    """``value`` as JSON-able data. Objects that are not plain data go through
    ``to_ref`` (which returns a ref dict or raises ``TypeError``). ``lenient`` (the
    solution's side) also converts subclasses of the built-in types (a namedtuple, a
    Counter, an IntEnum) to the built-in value, as an in-process comparison would treat
    them; the strict side (the test runner's) sends exact types only."""
    if depth > MAX_DEPTH:
        raise TypeError("value nested too deeply")
    t = type(value)
    if t is int and value.bit_length() > _BIG_INT_BITS:
        # hex both ways is linear in the length; decimal is quadratic and capped
        return {"t": "int", "v": format(value, "x")}
    if t in _SCALARS:
        return value
    d = depth + 1
    if t is list:
        return [encode(v, to_ref, lenient, d) for v in value]
    if t is tuple:
        return {"t": "tuple", "v": [encode(v, to_ref, lenient, d) for v in value]}
    if t is dict:
        items = [
            [encode(k, to_ref, lenient, d), encode(v, to_ref, lenient, d)] for k, v in value.items()
        ]
        return {"t": "dict", "v": items}
    if t is set or t is frozenset:
        return {"t": t.__name__, "v": [encode(v, to_ref, lenient, d) for v in value]}
    if t is bytes or t is bytearray:
        return {"t": t.__name__, "v": bytes(value).hex()}
    if t is complex:
        return {"t": "complex", "v": [value.real, value.imag]}
    # only a program that imported these can hold one: no import here
    fractions, decimal = sys.modules.get("fractions"), sys.modules.get("decimal")
    if fractions is not None and t is fractions.Fraction:
        return {"t": "fraction", "v": [value.numerator, value.denominator]}
    if decimal is not None and t is decimal.Decimal:
        return {"t": "decimal", "v": str(value)}
    if lenient:
        if isinstance(value, bool):
            return bool.__bool__(value)
        if isinstance(value, int):
            return encode(int.__int__(value), to_ref, lenient, d)
        if isinstance(value, float):
            return float.__float__(value)
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, tuple):
            return encode(tuple(tuple.__iter__(value)), to_ref, lenient, d)
        if isinstance(value, list):
            return encode(list(list.__iter__(value)), to_ref, lenient, d)
        if isinstance(value, dict):
            return encode(dict(dict.items(value)), to_ref, lenient, d)
        if isinstance(value, frozenset):
            return encode(frozenset(frozenset.__iter__(value)), to_ref, lenient, d)
        if isinstance(value, set):
            return encode(set(set.__iter__(value)), to_ref, lenient, d)
    return to_ref(value)


def decode(obj, from_ref, depth=0):
    """The value ``obj`` encodes; refs become ``from_ref(ref_dict)``."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    t = type(obj)
    if t in _SCALARS:
        return obj
    d = depth + 1
    if t is list:
        return [decode(v, from_ref, d) for v in obj]
    if t is not dict:
        raise WireError("unexpected " + t.__name__)
    tag, v = obj.get("t"), obj.get("v")
    try:
        return _decode_tagged(tag, v, from_ref, obj, d)
    except WireError:
        raise
    except (TypeError, ValueError, ArithmeticError, KeyError, IndexError) as exc:
        raise WireError("bad " + str(tag)[:20] + " value: " + str(exc)[:80]) from None


def _decode_tagged(tag, v, from_ref, obj, d):
    if tag == "int":
        if type(v) is not str or len(v) > (1 << 22):
            raise WireError("bad int")
        return int(v, 16)
    if tag == "tuple":
        return tuple(decode(x, from_ref, d) for x in v)
    if tag == "dict":
        return {decode(k, from_ref, d): decode(x, from_ref, d) for k, x in v}
    if tag == "set":
        return {decode(x, from_ref, d) for x in v}
    if tag == "frozenset":
        return frozenset(decode(x, from_ref, d) for x in v)
    if tag == "bytes":
        return bytes.fromhex(v)
    if tag == "bytearray":
        return bytearray.fromhex(v)
    if tag == "complex":
        return complex(float(v[0]), float(v[1]))
    if tag == "fraction":
        import fractions

        return fractions.Fraction(int(v[0]), int(v[1]))
    if tag == "decimal":
        import decimal

        return decimal.Decimal(str(v))
    if tag in ("ref", "module"):
        return from_ref(obj)
    raise WireError("unknown tag " + repr(tag)[:40])
