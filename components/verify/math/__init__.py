"""Math answer verifier: extract a final answer from a model response and judge it.

This is the reward function the verify stage uses for math data (MATH, GSM8K and
similar). It is importable on its own, e.g. from a notebook::

    from components.verify.math import compute_score
    compute_score("... so the answer is $\\boxed{\\frac{1}{2}}$", "0.5")
    # {"score": 1.0, "extracted_answer": "\\frac{1}{2}", "rule": "boxed"}

Pipeline (see docs/verifiers.md for the full rules):

1. ``extract_answer`` picks the answer out of the response: the last ``\\boxed{...}``,
   else the last ``\\fbox{...}``, else a "final answer is X" / "the answer is X" phrase,
   else GSM8K's ``#### X``.
2. Both sides are normalized (LaTeX spelling, units, percent, degrees, thousands
   separators, ...). The ground truth is read leniently, the response strictly.
3. Equivalence is decided cheapest-first: exact string, numbers (exact for integers and
   fractions, 1e-6 relative tolerance once a decimal is involved), tuples / intervals /
   sets element-wise, and finally a sympy comparison.

Time bounds: ``compute_score`` returns within about a second on any input, in-process, with no
deadline of its own (``signal.alarm`` does not work off the main thread, and verl and TRL call
reward functions in-process): responses and answers are length-capped, sympy's input is
screened (whitelisted identifiers only, and an upper bound on the size of every integer it
would build, from its generated code before anything is evaluated: `_within_budget`), and it
compares by numeric probing rather than ``simplify``. Inside the verify stage the executor's
per-sample deadline remains a second line of defence.
"""

from components.verify.math.equivalence import (
    MAX_ANSWER_LEN,
    clear_caches,
    compute_score,
    is_equivalent,
)
from components.verify.math.extract import extract_answer
from components.verify.math.normalize import normalize_answer
from components.verify.math.symbolic import warm_up

__all__ = [
    "MAX_ANSWER_LEN",
    "clear_caches",
    "compute_score",
    "extract_answer",
    "is_equivalent",
    "normalize_answer",
    "warm_up",
]
