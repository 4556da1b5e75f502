"""Synthetic "count the shapes" images for the vision RLVR demo, drawn with Pillow, in verl's
Parquet format.

Every problem is one small RGB image (``IMAGE_SIZE`` x ``IMAGE_SIZE`` pixels on a black ground)
holding 1..``MAX_SHAPES`` shapes (square, circle or triangle; one of six bright colours each) at
random positions, never touching (at least ``GAP`` pixels apart); the question is how many there
are, the answer graded by the ``math`` verifier on ``\\boxed{N}``. The ground is black because
the demo's image processor does not normalise (``examples.vision_count.model``): a patch of
ground is all zeros, so a freshly initialised vision tower's features differ between images as
much as the shapes do. On a white ground (or with CLIP's normalisation) the shapes are a small
change on a large constant and the tiny model did not learn to count in the warm-up's budget.

Generation is deterministic in the seed. Splits never share an image: images are deduplicated
by their pixels, and no image of the eval (or dev) split appears in train.

Each row has the columns verl expects, with the images in HF datasets' Image layout:

* ``data_source`` (string): ``"vision_count"``;
* ``prompt`` (list<struct<role, content>>): one user message, ``<image>`` marking the image;
* ``images`` (list<struct<bytes: binary, path: string>>): one PNG, path null;
* ``reward_model`` (struct<ground_truth, style>): the count as a string and ``"rule"``;
* ``extra_info`` (struct<index, split, shapes>): ``shapes``, what was drawn where.

Run it on its own to write ``train.parquet`` and ``eval.parquet``::

    python -m examples.vision_count.data --out /tmp/vision-count --seed 0
"""

from __future__ import annotations

import argparse
import hashlib
import io
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

from examples.arithmetic.data import PROMPT_TYPE, REWARD_MODEL_TYPE

DATA_SOURCE = "vision_count"
IMAGE_SIZE = 56
BACKGROUND = (0, 0, 0)
#: Shape colours, bright and far from each other.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (60, 100, 255),
    "yellow": (240, 220, 40),
    "white": (240, 240, 240),
    "magenta": (220, 60, 220),
}
SHAPES = ("square", "circle", "triangle")
MAX_SHAPES = 6
#: A shape's bounding box side, in pixels.
MIN_SIDE, MAX_SIDE = 7, 12
#: The least gap between two shapes' bounding boxes (so they never touch).
GAP = 2
#: Problems held out of both files for the warm-up's dev checks (see ``prepare``).
N_DEV = 200

PROMPT = "<image>How many shapes?"

IMAGE_TYPE = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
EXTRA_INFO_TYPE = pa.struct(
    [("index", pa.int64()), ("split", pa.string()), ("shapes", pa.string())]
)
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", PROMPT_TYPE),
        ("images", IMAGE_TYPE),
        ("reward_model", REWARD_MODEL_TYPE),
        ("extra_info", EXTRA_INFO_TYPE),
    ]
)


@dataclass(frozen=True)
class Shape:
    """One drawn shape: kind, colour name and bounding box ``(x0, y0, x1, y1)`` (inclusive)."""

    kind: str
    colour: str
    box: tuple[int, int, int, int]


@dataclass(frozen=True)
class Problem:
    """One image of shapes; the answer is how many."""

    shapes: tuple[Shape, ...]

    @property
    def prompt_text(self) -> str:
        """The user message: the image, then the question."""
        return PROMPT

    @property
    def answer(self) -> str:
        return str(len(self.shapes))

    @property
    def description(self) -> str:
        return " ".join(f"{s.colour}-{s.kind}@{s.box[0]},{s.box[1]}" for s in self.shapes)

    def image(self) -> Image.Image:
        """The problem's picture (RGB, no anti-aliasing: every pixel is ground or a colour)."""
        im = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUND)
        draw = ImageDraw.Draw(im)
        for s in self.shapes:
            x0, y0, x1, y1 = s.box
            fill = COLOURS[s.colour]
            if s.kind == "circle":
                draw.ellipse(s.box, fill=fill)
            elif s.kind == "triangle":
                draw.polygon([((x0 + x1) // 2, y0), (x0, y1), (x1, y1)], fill=fill)
            else:
                draw.rectangle(s.box, fill=fill)
        return im

    def png(self) -> bytes:
        buf = io.BytesIO()
        self.image().save(buf, format="PNG")
        return buf.getvalue()


def _apart(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    """The boxes are more than ``GAP`` pixels apart on one axis."""
    return a[2] + GAP < b[0] or b[2] + GAP < a[0] or a[3] + GAP < b[1] or b[3] + GAP < a[1]


def draw_problem(rng: random.Random, max_shapes: int = MAX_SHAPES) -> Problem:
    """1..``max_shapes`` shapes (the count uniform) at random positions, none touching another."""
    n = rng.randint(1, max_shapes)
    while True:  # a fresh layout if one of them does not fit (rare)
        shapes: list[Shape] = []
        for _ in range(n):
            for _try in range(100):
                side = rng.randint(MIN_SIDE, MAX_SIDE)
                x0 = rng.randint(1, IMAGE_SIZE - side - 1)
                y0 = rng.randint(1, IMAGE_SIZE - side - 1)
                box = (x0, y0, x0 + side - 1, y0 + side - 1)
                if all(_apart(box, s.box) for s in shapes):
                    shapes.append(Shape(rng.choice(SHAPES), rng.choice(sorted(COLOURS)), box))
                    break
        if len(shapes) == n:
            return Problem(tuple(shapes))


def make_splits(
    *, seed: int, n_train: int, n_eval: int, n_dev: int = 0, max_shapes: int = MAX_SHAPES
) -> dict[str, list[Problem]]:
    """Draw the ``eval``, ``dev`` and ``train`` problem lists, deterministic in ``seed``; every
    image is distinct (by its pixels) within and across splits."""
    rng = random.Random(seed)
    seen: set[bytes] = set()
    splits: dict[str, list[Problem]] = {}
    for split, n in (("eval", n_eval), ("dev", n_dev), ("train", n_train)):
        rows: list[Problem] = []
        while len(rows) < n:
            p = draw_problem(rng, max_shapes)
            key = hashlib.sha1(p.image().tobytes()).digest()
            if key not in seen:
                seen.add(key)
                rows.append(p)
        splits[split] = rows
    return splits


def to_table(problems: Sequence[Problem], split: str) -> pa.Table:
    """Rows in verl's multimodal dataset format."""
    rows = {
        "data_source": [DATA_SOURCE] * len(problems),
        "prompt": [[{"role": "user", "content": p.prompt_text}] for p in problems],
        "images": [[{"bytes": p.png(), "path": None}] for p in problems],
        "reward_model": [{"ground_truth": p.answer, "style": "rule"} for p in problems],
        "extra_info": [
            {"index": i, "split": split, "shapes": p.description} for i, p in enumerate(problems)
        ],
    }
    return pa.Table.from_pydict(rows, schema=SCHEMA)


def write_table(problems: Iterable[Problem], split: str, path: Path) -> Path:
    """Write ``to_table(problems, split)`` to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(to_table(list(problems), split), tmp)
    tmp.replace(path)
    return path


def write_datasets(
    out_dir: Path, *, seed: int, n_train: int, n_eval: int, n_dev: int = N_DEV
) -> tuple[Path, Path]:
    """Write ``out_dir/train.parquet`` and ``out_dir/eval.parquet``; return their paths
    (``n_dev`` problems are held out of both, as ``prepare`` does; keep the default to get the
    same files as ``prepare``)."""
    out_dir = Path(out_dir)
    splits = make_splits(seed=seed, n_train=n_train, n_eval=n_eval, n_dev=n_dev)
    train = write_table(splits["train"], "train", out_dir / "train.parquet")
    evaluation = write_table(splits["eval"], "eval", out_dir / "eval.parquet")
    return train, evaluation


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=8000)
    parser.add_argument("--n-eval", type=int, default=200)
    args = parser.parse_args(argv)
    for path in write_datasets(args.out, seed=args.seed, n_train=args.n_train, n_eval=args.n_eval):
        print(path)


if __name__ == "__main__":
    main()
