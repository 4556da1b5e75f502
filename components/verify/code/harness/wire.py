"""The code verifier's wire format: framed messages and a codec for plain data.

Stdlib only and self-contained: the parent imports it as
``components.verify.code.harness.wire``, and each sandbox gets a copy as ``rlvr_wire.py``
next to its ``main.py``.

Frames: one byte of kind, four bytes of big-endian length, a JSON payload.

* ``R`` from the solution's process: its ready message or the answer to a query;
* ``Q`` from the test runner: a query for the solution's process (a call, an attribute);
* ``V`` from the test runner: the verdict.

Values: JSON ``null``/booleans/numbers/strings are themselves, a JSON array is a
``list``, and every JSON object is tagged: ``{"t": tag, "v": ...}`` for ``tuple``,
``set``, ``frozenset``, ``dict`` (``v``: ``[[key, value], ...]``), ``bytes`` and
``bytearray`` (hex), ``complex`` (``[re, im]``), ``fraction`` (``[num, den]``),
``decimal`` (its string), ``module`` (a module *name*: the receiver imports its own copy),
and ``ref`` (``{"t": "ref", "id": n, "type": name, "call": bool}``: an object that stays
in the solution's process and is reached through further queries). Decoding builds only
those types: nothing in a message can run code in the receiver.
"""

import decimal
import fractions
import json
import struct

FRAME = struct.Struct(">cI")
MAX_DEPTH = 200
_SCALARS = (type(None), bool, int, float, str)


class WireError(Exception):
    """A malformed frame or value."""


def send(sock, kind, obj):
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    sock.sendall(FRAME.pack(kind, len(data)) + data)


def _read_exact(sock, n):
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("channel closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(sock):
    kind, size = FRAME.unpack(_read_exact(sock, FRAME.size))
    return kind, json.loads(_read_exact(sock, size).decode("utf-8"))


def encode(value, to_ref, lenient=False, depth=0):
    """``value`` as JSON-able data. Objects that are not plain data go through
    ``to_ref`` (which returns a ref dict or raises ``TypeError``). ``lenient`` (the
    solution's side) also converts subclasses of the built-in types (a namedtuple, a
    Counter, an IntEnum) to the built-in value, as an in-process comparison would treat
    them; the strict side (the test runner's) sends exact types only."""
    if depth > MAX_DEPTH:
        raise TypeError("value nested too deeply")
    t = type(value)
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
    if t is fractions.Fraction:
        return {"t": "fraction", "v": [value.numerator, value.denominator]}
    if t is decimal.Decimal:
        return {"t": "decimal", "v": str(value)}
    if lenient:
        if isinstance(value, bool):
            return bool.__bool__(value)
        if isinstance(value, int):
            return int.__int__(value)
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
        return fractions.Fraction(int(v[0]), int(v[1]))
    if tag == "decimal":
        return decimal.Decimal(str(v))
    if tag in ("ref", "module"):
        return from_ref(obj)
    raise WireError("unknown tag " + repr(tag)[:40])
