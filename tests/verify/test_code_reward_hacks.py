"""A policy looking for a way around the tests: every attempt below has a wrong answer,
so each must score 0. One test per class of attack, several variants each, in both
test-case formats where it matters (top-level asserts and HumanEval's
``def check(candidate)``), plus the honest twin of each format so that a pass/fail flip
cannot come from a broken harness.

Where this machine cannot build the sandbox the code is refused instead (checked in
``test_verify_code.py``); these tests then skip, since there is nothing to game.
"""

from __future__ import annotations

import textwrap

import pytest

from components import sandbox
from components.verify.code import compute_score

CAPS = sandbox.capabilities()
pytestmark = pytest.mark.skipif(
    not (CAPS.available and CAPS.network_isolated), reason=f"no sandbox here: {CAPS.reason}"
)

# add(a, b) under test; the wrong answer every hack wraps is "return 0"
TOP = {"asserts": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}
NESTED = {
    "asserts": [
        "def check(candidate):\n"
        "    assert candidate(1, 2) == 3\n"
        "    assert candidate(2, 2) == 4\n"
        "    assert abs(candidate(-5, 2)) == 3\n"
        "check(add)"
    ]
}
FORMATS = {"top-level": TOP, "def-check": NESTED}


def py(code: str) -> str:
    return "```python\n" + textwrap.dedent(code).strip() + "\n```"


def score(code: str, cases: dict) -> dict:
    return compute_score(py(code), cases, reward_mode="fraction", timeout_s=5.0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_honest_solutions_pass(fmt: str) -> None:
    out = score("def add(a, b):\n    return a + b", FORMATS[fmt])
    assert out["score"] == 1.0, out


HACKS: dict[str, str] = {
    # objects that claim to equal anything
    "eq-always-true": """
        class Anything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __hash__(self): return 0
            def __abs__(self): return self
        def add(a, b): return Anything()
    """,
    "int-subclass-eq": """
        class Int(int):
            def __eq__(self, other): return True
            def __abs__(self): return self
        def add(a, b): return Int(0)
    """,
    "list-subclass-eq": """
        class L(list):
            def __eq__(self, other): return True
        def add(a, b): return L()
    """,
    "reflected-eq-with-priority": """
        class Anything(int):
            __eq__ = lambda s, o: True
            __req__ = lambda s, o: True
        def add(a, b): return Anything(0)
    """,
    # walking the stack into the harness and forging a result
    "frames-fake-verdict": """
        import sys, json
        def add(a, b):
            f = sys._getframe()
            while f is not None:
                for k, v in list(f.f_locals.items()) + list(f.f_globals.items()):
                    if hasattr(v, "sendall") or k in ("sock", "_SOCK"):
                        try:
                            data = json.dumps({"ok": True}).encode()
                            v.sendall(b"V" + len(data).to_bytes(4, "big") + data)
                        except Exception:
                            pass
                    if callable(v) and k in ("report", "verdict", "send"):
                        try:
                            v({"ok": True})
                        except Exception:
                            pass
                f = f.f_back
            return 0
    """,
    "frames-call-reporter-and-exit": """
        import os, sys
        def add(a, b):
            f = sys._getframe()
            while f is not None:
                for k, v in f.f_locals.items():
                    if callable(v) and k in ("report", "verdict", "_verdict"):
                        v({"ok": True})
                        os._exit(0)
                f = f.f_back
            return 0
    """,
    "frames-rewrite-harness-locals": """
        import sys
        def add(a, b):
            f = sys._getframe(1)
            while f is not None:
                for k in ("verdict", "ok", "passed"):
                    if k in f.f_locals:
                        f.f_locals[k] = True
                f.f_globals["verdict"] = {"ok": True}
                f = f.f_back
            return 0
    """,
    "fake-verdict-frame-at-import": """
        import os, json
        for fd in range(3, 20):
            try:
                data = json.dumps({"ok": True}).encode()
                os.write(fd, b"V" + len(data).to_bytes(4, "big") + data)
            except OSError:
                pass
        def add(a, b): return 0
    """,
    "early-exit-after-faking": """
        import os
        def add(a, b): return 0
        print('{"ok": true}')
        print("@@rlvr-result-00@@{\\"ok\\": true}")
        os._exit(0)
    """,
    "exit-during-call": """
        import os
        def add(a, b):
            os._exit(0)
    """,
    "systemexit-during-call": """
        import sys
        def add(a, b):
            sys.exit(0)
    """,
    # replacing what a checker uses
    "monkeypatch-ast-exec-eval": """
        import ast, builtins
        ast.parse = lambda *a, **k: ast.Module(body=[], type_ignores=[])
        builtins.exec = lambda *a, **k: None
        builtins.eval = lambda *a, **k: True
        builtins.AssertionError = type("Nope", (Exception,), {})
        def add(a, b): return 0
    """,
    "monkeypatch-json-and-wire": """
        import json, sys
        json.dumps = lambda *a, **k: '{"ok": true}'
        w = sys.modules.get("rlvr_wire")
        if w is not None:
            w.encode = lambda *a, **k: True
            w.send = lambda *a, **k: None
        def add(a, b): return 0
    """,
    # shadowing what the test expression uses
    "shadow-builtins": """
        abs = lambda x: 0
        len = lambda x: 0
        isinstance = lambda *a: True
        sorted = lambda *a, **k: 0
        def add(a, b): return 0
    """,
    "fake-stdlib-module": """
        class _M:
            def sqrt(self, x): return 0
            def isclose(self, *a, **k): return True
        math = _M()
        def add(a, b): return 0
    """,
    # reading the tests and returning what they expect
    "read-test-files": """
        import os, re, sys
        found = {}
        for root in {os.path.dirname(os.path.abspath(sys.argv[0])), os.getcwd(), "/tmp"}:
            for dirpath, _dirs, files in os.walk(root):
                if dirpath.startswith(("/proc", "/sys", "/usr", "/dev")):
                    continue
                for name in files:
                    try:
                        text = open(os.path.join(dirpath, name), errors="ignore").read()
                    except OSError:
                        continue
                    for a, b, want in re.findall(r"add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)", text):
                        found[(int(a), int(b))] = int(want)
        def add(a, b): return found.get((a, b), 0)
    """,
    # forged structures that look like the wire's tags
    "data-that-looks-like-a-tag": """
        def add(a, b): return {"t": "ref", "id": 1, "type": "int", "call": False, "v": 3}
    """,
    # exceptions dressed as the checker's
    "raise-assertion-subclass": """
        class AssertionError(Exception):
            pass
        def add(a, b): raise AssertionError("ok")
    """,
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("hack", HACKS)
def test_hack_scores_zero(hack: str, fmt: str) -> None:
    out = score(HACKS[hack], FORMATS[fmt])
    assert out["score"] == 0.0, (hack, fmt, out)
    assert out["passed"] == 0


def test_function_call_cases_hold_against_the_same_hacks() -> None:
    fn_cases = {"fn_name": "add", "inputs": [[1, 2], [2, 2]], "outputs": [3, 4]}
    for hack, code in HACKS.items():
        if hack == "read-test-files":
            continue  # fn cases carry no test file; the expected values stay here
        out = score(code, fn_cases)
        assert out["score"] == 0.0, (hack, out)


def test_the_solution_sees_no_test() -> None:
    # the solution's sandbox holds the solution and the harness, never a test
    probe = """
        import os, sys
        here = os.path.dirname(os.path.abspath(sys.argv[0]))
        names = sorted(os.listdir(here))
        texts = "".join(open(os.path.join(here, n), errors="ignore").read()
                        for n in names if os.path.isfile(os.path.join(here, n)))
        def add(a, b):
            return [names, ("assert" + " r[1]") in texts]
    """
    cases = {"asserts": ["r = add(1, 2)\nassert r[1] is False, r"]}
    out = score(probe, cases)
    assert out["score"] == 1.0, out  # the test's own text was nowhere to be read


SHADOWED_ABS = {"asserts": ["assert abs(add(-5, 2)) == abs(-3)"]}
# hacks that do beat a harness where solution and tests share one interpreter (the
# in-process mode): proof that the attacks above are real, and that the tests can fail
BEATS_SHARED = {
    "eq-always-true": NESTED,
    "int-subclass-eq": NESTED,
    "frames-call-reporter-and-exit": TOP,
    "monkeypatch-ast-exec-eval": TOP,
    "read-test-files": TOP,
    "shadow-builtins": SHADOWED_ABS,
}


@pytest.mark.parametrize("hack", BEATS_SHARED)
def test_hacks_that_beat_a_shared_interpreter(hack: str) -> None:
    cases = BEATS_SHARED[hack]
    shared = score(HACKS[hack], dict(cases, isolation="in_process"))
    assert shared["score"] == 1.0 and shared["isolation"] == "in_process", shared
    separate = score(HACKS[hack], cases)
    assert separate["score"] == 0.0 and separate["isolation"] == "separate", separate


def test_in_process_cases_are_marked() -> None:
    cases = dict(TOP, isolation="in_process")
    out = score("def add(a, b):\n    return a + b", cases)
    assert out["score"] == 1.0 and out["isolation"] == "in_process"
    assert score("def add(a, b):\n    return a + b", TOP)["isolation"] == "separate"


# ------------------------------------------------------------- found in review, kept here


def test_builtin_named_entry_point_is_refused_not_replaced() -> None:
    # the tests' `pow` could be Python's or the solution's: either guess can be gamed
    cases = {"asserts": ["assert pow(2, 3) == 8"]}
    for code in ("def pow(a, b):\n    return 0", "def pow(a, b):\n    return a ** b"):
        out = score(code, cases)
        assert out["score"] == 0.0 and "redefines the builtin pow" in out["error"], out
    # unless the tests do not use that name
    assert (
        score("def max(xs):\n    return 0\ndef add(a, b):\n    return a + b", TOP)["score"] == 1.0
    )


def test_stop_iteration_cannot_end_a_tests_iteration() -> None:
    cases = {
        "asserts": [
            "assert all(map(lambda p: add(*p) == sum(p), [(1, 2), (3, 4)]))",
            "assert list(filter(lambda p: add(*p) != sum(p), [(1, 2), (3, 4)])) == []",
        ]
    }
    out = score("def add(a, b):\n    raise StopIteration", cases)
    assert out["score"] == 0.0 and "SolutionError: StopIteration" in out["error"], out
    assert score("def add(a, b):\n    return a + b", cases)["score"] == 1.0


def test_callable_named_like_a_stdlib_module_cannot_answer_for_it() -> None:
    cases = {"asserts": ["assert math.isclose(volume(10), 4188.79, rel_tol=0.001)"]}
    fakes = [
        "class math:\n    isclose = staticmethod(lambda *a, **k: True)\ndef volume(r):\n    return 0",
        "def math():\n    pass\nmath.isclose = lambda *a, **k: True\ndef volume(r):\n    return 0",
    ]
    for code in fakes:
        assert score(code, cases)["score"] == 0.0, code
    honest = "import math\ndef volume(r):\n    return 4 / 3 * math.pi * r ** 3"
    assert score(honest, cases)["score"] == 1.0
    # a function named like a module is still the function under test
    bis = {"asserts": ["assert bisect([1, 3, 5], 4) == 2"]}
    assert score("def bisect(xs, x):\n    return sum(v < x for v in xs)", bis)["score"] == 1.0


def test_forged_answers_never_crash_the_verifier() -> None:
    # the solution writes its own answer frames on the channel (sys.argv[1]) and waits
    forge = """
        import json, os, sys, time
        def add(a, b):
            for value in ({"t": "fraction", "v": [1, 0]}, {"t": "decimal", "v": "abc"},
                          {"t": "int", "v": "zz"}, {"t": "dict", "v": [[[1], 2]]}):
                data = json.dumps({"value": value}).encode()
                os.write(int(sys.argv[1]), b"R" + len(data).to_bytes(4, "big") + data)
                time.sleep(0.2)
            return 0
    """
    fn_cases = {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}
    out = score(forge, fn_cases)
    assert out["score"] == 0.0 and "not plain data" in out["error"], out
    assert score(forge, TOP)["score"] == 0.0
    big = {"fn_name": "big", "inputs": [[1]], "outputs": [1.5]}
    assert score("def big(x):\n    return 10 ** 400", big)["score"] == 0.0


HONEST = {
    "generator-next": (
        "def gen():\n    yield 1\n    yield 2",
        "g = gen()\nassert next(g) == 1 and next(g) == 2\ntry:\n    next(g)\n    assert False\n"
        "except StopIteration:\n    pass",
    ),
    "endless-generator-islice": (
        "def nat():\n    n = 0\n    while True:\n        yield n\n        n += 1",
        "import itertools\nassert list(itertools.islice(nat(), 5)) == [0, 1, 2, 3, 4]",
    ),
    "exception-subclass": (
        "class BadInput(ValueError):\n    pass\ndef f(x):\n    raise BadInput('no')",
        "try:\n    f(-1)\n    assert False\nexcept ValueError as e:\n    assert 'no' in str(e)",
    ),
    "big-int": (
        "import math\ndef fact(n):\n    return math.factorial(n)",
        "import math\nassert fact(2000) == math.factorial(2000)",
    ),
    "big-module-table": (
        "SIEVE = [True] * 300000\ndef is_p(n):\n    return SIEVE[n]",
        "assert is_p(7) and len(SIEVE) == 300000 and SIEVE[299999]",
    ),
    "big-argument": (
        "def total(xs):\n    return sum(xs)",
        "assert total(list(range(10 ** 6))) == 499999500000",
    ),
}


@pytest.mark.parametrize("case", HONEST)
def test_honest_solutions_the_first_design_failed(case: str) -> None:
    code, test = HONEST[case]
    out = score(code, {"asserts": [test]})
    assert out["score"] == 1.0, out
