"""Accuracy and speed of the math verifier against math-verify, on labelled sets (a script).

    pip install -e ".[bench]"       # math-verify, a benchmark-only dependency
    python benchmarks/verify_accuracy.py [--data FILE ...] [--show]

Every case of each labelled set (JSON lines: response, ground_truth, label, and a family or
category) is scored by ``components.verify.math.compute_score`` and by math-verify
(``verify(parse(gold), parse(response))``) in the same process. Printed per family and overall,
for both: accuracy, false positives (a reward for a wrong answer) and false negatives (no reward
for a right one); then the whole-set throughput of each and their ratio (goal: at least 20x
math-verify's; `benchmarks/verify_throughput.py` measures the common-answer rate). The default
sets: the original equivalence set, the recall set written before the recall rules,
the held-out sets written independently of the verifier's code, and the development set of
the written-forms rules (labelled answers, joined lists, ranges, spellings) and its
held-out set.
``--show`` lists every case either judge gets wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.verify.math import clear_caches, compute_score, warm_up  # noqa: E402

DATA = ROOT / "tests" / "data"
DEFAULT = [
    "math_equivalence.jsonl",
    "math_recall.jsonl",
    "math_heldout_v1.jsonl",
    "math_heldout.jsonl",
    "math_recall_v2.jsonl",
    "math_heldout_v2.jsonl",
]


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


def score(rows: list[dict], judge: Callable[[str, str], bool]) -> tuple[list[bool], float]:
    t0 = time.perf_counter()
    out = [judge(r["response"], r["ground_truth"]) for r in rows]
    return out, time.perf_counter() - t0


def table(name: str, rows: list[dict], verdicts: dict[str, list[bool]]) -> None:
    judges = list(verdicts)
    fams: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        fams[r.get("family") or r.get("category", "-")].append(i)
    head = "".join(f"{j + ' acc/FP/FN':>26}" for j in judges)
    print(f"\n{name}: {len(rows)} cases\n{'family':<18}{'n':>5}{head}")

    def cells(idx: list[int]) -> str:
        out = ""
        for j in judges:
            v = verdicts[j]
            ok = sum(v[i] == rows[i]["label"] for i in idx)
            fp = sum(v[i] and not rows[i]["label"] for i in idx)
            fn = sum(not v[i] and rows[i]["label"] for i in idx)
            out += f"{ok / len(idx):>14.3f} {fp:>4d} {fn:>5d}  "
        return out

    for fam in sorted(fams):
        print(f"{fam:<18}{len(fams[fam]):>5}{cells(fams[fam])}")
    print(f"{'overall':<18}{len(rows):>5}{cells(list(range(len(rows))))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", nargs="*", default=DEFAULT, help="JSONL sets (under tests/data)")
    parser.add_argument("--show", action="store_true", help="list the cases either judge misses")
    args = parser.parse_args()
    judges: dict[str, Callable[[str, str], bool]] = {"rlvr": _ours}
    mv = _math_verify()
    if mv is not None:
        judges["math-verify"] = mv
    warm_up()
    seconds: dict[str, float] = defaultdict(float)
    cases = 0
    for name in args.data:
        path = Path(name) if Path(name).is_file() else DATA / name
        if not path.is_file():
            print(f"{path}: missing, skipped")
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        verdicts = {}
        for j, fn in judges.items():
            clear_caches()
            verdicts[j], s = score(rows, fn)
            seconds[j] += s
        cases += len(rows)
        table(path.name, rows, verdicts)
        if args.show:
            for i, r in enumerate(rows):
                wrong = [j for j in judges if verdicts[j][i] != r["label"]]
                if wrong:
                    print(
                        f"  [{r.get('family') or r.get('category')}] wrong: {','.join(wrong)}; "
                        f"gt={r['ground_truth']!r} label={r['label']} "
                        f"response=...{r['response'][-90:]!r}"
                    )
    print(f"\nspeed over all {cases} cases (caches cleared per set):")
    for j in judges:
        print(f"  {j:<12}{cases / seconds[j]:>10.0f} verifications/s")
    if mv is not None:
        print(
            f"  rlvr / math-verify: {seconds['math-verify'] / seconds['rlvr']:.0f}x (goal >= 20x)"
        )
    else:
        print("math-verify is not installed (pip install -e '.[bench]'): its columns are skipped")


if __name__ == "__main__":
    main()
