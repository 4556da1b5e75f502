"""The in-process harness, for test cases marked ``"isolation": "in_process"``.

The solution and the tests share one interpreter here, so the solution can reach what
decides the verdict (frames, modules, builtins); results from this harness are marked
``isolation: in_process``. It exists for the rare tests that need the solution's objects
in their own interpreter (subclassing a solution class, passing callbacks); everything
else runs through ``server.py`` and ``runner.py``. The result line is prefixed by a random
marker read from stdin before the solution runs, and top-level ``assert a == b`` compares
plain data, which stops the cheapest forgeries only.
"""

import json
import os
import sys


def _main():
    marker = sys.stdin.readline().rstrip("\n")
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "case.json"), encoding="utf-8") as f:
        case = json.load(f)
    with open(os.path.join(here, "solution.py"), encoding="utf-8") as f:
        source = f.read()
    dumps, write, flush = json.dumps, os.write, sys.stdout.flush
    plain_types = (type(None), bool, int, float, str, list, tuple, dict, set, frozenset)

    def plain(x, depth=0):
        t = type(x)
        if t not in plain_types or depth > 100:
            raise TypeError("not plain: " + t.__name__)
        if t in (list, tuple):
            return [plain(v, depth + 1) for v in x]
        if t in (set, frozenset):
            items = [plain(v, depth + 1) for v in x]
            try:
                return sorted(items)
            except TypeError:
                return sorted(items, key=repr)
        if t is dict:
            return {str(k): plain(v, depth + 1) for k, v in x.items()}
        return x

    def report(payload):
        flush()
        write(1, ("\n" + marker + dumps(payload) + "\n").encode("utf-8"))

    import ast

    scope = {"__name__": "__solution__", "__builtins__": __builtins__}
    try:
        exec(compile(source, "solution.py", "exec"), scope)
    except BaseException as exc:
        report({"error": "solution raised " + type(exc).__name__ + ": " + str(exc)[:300]})
        return
    try:
        if case.get("setup"):
            exec(compile(case["setup"], "<setup>", "exec"), scope)
        tree = ast.parse(case["test"], "<test>", "exec")
        for node in tree.body:
            test = node.test if isinstance(node, ast.Assert) else None
            if (
                isinstance(test, ast.Compare)
                and len(test.ops) == 1
                and isinstance(test.ops[0], ast.Eq)
            ):
                left = eval(compile(ast.Expression(test.left), "<test>", "eval"), scope)
                right = eval(compile(ast.Expression(test.comparators[0]), "<test>", "eval"), scope)
                try:
                    ok = plain(left) == plain(right)
                except (TypeError, RecursionError):
                    # user-defined values on both sides: their own __eq__ decides; plain
                    # data on one side only never equals a user-defined object
                    ok = (
                        type(left) not in plain_types
                        and type(right) not in plain_types
                        and (left == right) is True
                    )
                if not ok:
                    report({"ok": False, "error": "assertion failed: " + repr(left)[:200]})
                    return
            else:
                module = ast.Module(body=[node], type_ignores=[])
                exec(compile(module, "<test>", "exec"), scope)
    except AssertionError as exc:
        report({"ok": False, "error": "assertion failed " + str(exc)[:200]})
        return
    except BaseException as exc:
        report({"ok": False, "error": type(exc).__name__ + ": " + str(exc)[:300]})
        return
    report({"ok": True})


_main()
