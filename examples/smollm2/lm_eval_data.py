"""The data of the SmolLM2 example's standard-benchmark suite (lm_eval_tasks/), written by its
prepare step in lm-eval's JSON-lines form:

* ``capitals_choice.jsonl``: 40 countries, each with its capital and three other capitals of the
  list as choices (general knowledge the arithmetic RL should not touch);
* ``sums_greedy.jsonl``: 40 problems of the example's families in its prompt form, drawn with
  another seed than the train and held-out sets (it may share problems with them).
"""

from __future__ import annotations

import random
from pathlib import Path

from examples.arithmetic.lm_eval_data import write_jsonl_once
from examples.smollm2.task import FAMILY_WEIGHTS, Problem, number_pairs

FILES = ("capitals_choice.jsonl", "sums_greedy.jsonl")
CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "Japan": "Tokyo",
    "China": "Beijing",
    "India": "New Delhi",
    "Russia": "Moscow",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Canada": "Ottawa",
    "Mexico": "Mexico City",
    "Brazil": "Brasilia",
    "Argentina": "Buenos Aires",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Australia": "Canberra",
    "Greece": "Athens",
    "Turkey": "Ankara",
    "Poland": "Warsaw",
    "Austria": "Vienna",
    "Sweden": "Stockholm",
    "Norway": "Oslo",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Ireland": "Dublin",
    "Belgium": "Brussels",
    "Netherlands": "Amsterdam",
    "Switzerland": "Bern",
    "Hungary": "Budapest",
    "Thailand": "Bangkok",
    "Vietnam": "Hanoi",
    "South Korea": "Seoul",
    "Indonesia": "Jakarta",
    "Iran": "Tehran",
    "Iraq": "Baghdad",
    "Morocco": "Rabat",
    "Nigeria": "Abuja",
    "Cuba": "Havana",
}


def _rows(rng: random.Random) -> dict[str, list[dict]]:
    capitals = sorted(CAPITALS.values())
    choice_rows = []
    for country, capital in CAPITALS.items():
        options = [capital, *rng.sample([c for c in capitals if c != capital], 3)]
        rng.shuffle(options)
        choice_rows.append(
            {"country": country, "choices": options, "label": options.index(capital)}
        )
    families = list(FAMILY_WEIGHTS)
    greedy_rows = []
    for _ in range(40):
        family = rng.choices(families, weights=[FAMILY_WEIGHTS[f] for f in families])[0]
        a, b = rng.choice(number_pairs(family))
        p = Problem(family, a, b)
        greedy_rows.append({"question": p.prompt_text, "answer": str(p.answer)})
    return dict(zip(FILES, (choice_rows, greedy_rows), strict=True))


def write_lm_eval_data(out: Path, seed: int = 11) -> Path:
    """``out/lm_eval/*.jsonl`` (kept when already there), each file renamed into place whole."""
    return write_jsonl_once(out, _rows, seed)
