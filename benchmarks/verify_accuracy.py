"""Accuracy benchmark for the math verifier (a script, not a test).

Scores every case of tests/data/math_equivalence.jsonl with
``components.verify.math.compute_score`` and, when it is installed, with ``math_verify``
(``verify(parse(gold), parse(response))``), and prints their agreement with the labels
side by side, overall and per category. ``--show`` lists the disagreements.

Usage: ``python benchmarks/verify_accuracy.py [--show]``
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.verify.math import compute_score  # noqa: E402

DATA = ROOT / "tests" / "data" / "math_equivalence.jsonl"


def _ours(response: str, gt: str) -> bool:
    return compute_score(response, gt)["score"] == 1.0


def _math_verify() -> Callable[[str, str], bool] | None:
    try:
        from math_verify import parse, verify
    except ImportError:
        return None

    def judge(response: str, gt: str) -> bool:
        try:
            return bool(verify(parse(f"${gt}$"), parse(response)))
        except Exception:
            return False

    return judge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--show", action="store_true", help="list the disagreements")
    args = parser.parse_args()

    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    judges: dict[str, Callable[[str, str], bool]] = {"this verifier": _ours}
    mv = _math_verify()
    if mv is not None:
        judges["math_verify"] = mv

    correct: dict[str, dict[str, int]] = {name: defaultdict(int) for name in judges}
    totals: dict[str, int] = defaultdict(int)
    misses: dict[str, list[str]] = {name: [] for name in judges}
    for row in rows:
        totals[row["category"]] += 1
        for name, judge in judges.items():
            ok = judge(row["response"], row["ground_truth"]) == row["label"]
            correct[name][row["category"]] += ok
            if not ok:
                misses[name].append(
                    f"[{row['category']}] gt={row['ground_truth']!r} label={row['label']} "
                    f"response={row['response'][-70:]!r}"
                )

    names = list(judges)
    print(f"{len(rows)} labelled cases from {DATA.relative_to(ROOT)}")
    print(f"{'category':<14}{'n':>5}" + "".join(f"{n:>16}" for n in names))
    for cat in sorted(totals):
        cells = "".join(f"{correct[n][cat] / totals[cat]:>16.3f}" for n in names)
        print(f"{cat:<14}{totals[cat]:>5}{cells}")
    overall = "".join(f"{sum(correct[n].values()) / len(rows):>16.3f}" for n in names)
    print(f"{'overall':<14}{len(rows):>5}{overall}")
    if mv is None:
        print("math_verify not installed (pip install math-verify): its column is skipped")
    if args.show:
        for name in names:
            print(f"\n{name}: {len(misses[name])} disagreements")
            for line in misses[name]:
                print("  " + line)


if __name__ == "__main__":
    main()
