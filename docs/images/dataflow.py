"""Draws docs/images/dataflow.png, the README's picture of how data flows between the stages.

python docs/images/dataflow.py
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = Path(__file__).with_name("dataflow.png")
STAGES = [  # name, x, what it does, where it runs
    ("generate", 1.0, "samples n responses\nper prompt", "GPU pool · vLLM / transformers"),
    ("verify", 4.0, "scores every\nresponse", "CPU pool · sandboxed code"),
    ("train", 7.0, "one GRPO-family\nupdate", "GPU pool · DeepSpeed"),
    ("evaluate", 10.0, "pass@k, maj@k,\nlm-eval suites", "GPU pool"),
]
ARTIFACTS = [  # label, x
    ("checkpoints/i\n(bf16 handoff)", 0.9),
    ("iterations/i/rollouts\n(Parquet)", 3.1),
    ("iterations/i/scored\n(Parquet)", 5.4),
    ("checkpoints/i+1\ntrain_state/ every N", 7.8),
    ("evals/c\n(metrics, samples)", 10.1),
]
FLOWS = [  # (from, to): stage -> artifact is a write, artifact -> stage a read
    (("a", 0), ("s", 0)),
    (("s", 0), ("a", 1)),
    (("a", 1), ("s", 1)),
    (("s", 1), ("a", 2)),
    (("a", 2), ("s", 2)),
    (("s", 2), ("a", 3)),
    (("a", 3), ("s", 3)),
    (("s", 3), ("a", 4)),
]
STAGE_Y, STORE_Y = 3.2, 0.9


def box(ax, x, y, w, h, face, edge, **kw) -> None:
    ax.add_patch(
        FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.15",
            facecolor=face,
            edgecolor=edge,
            linewidth=1.2,
            **kw,
        )
    )


def point(kind: str, k: int) -> tuple[float, float]:
    if kind == "s":
        return STAGES[k][1], STAGE_Y - 0.63
    return ARTIFACTS[k][1], STORE_Y + 0.35


def main() -> Path:
    fig = Figure(figsize=(11.5, 5.0))
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(-0.6, 11.6)
    ax.set_ylim(-0.55, 4.85)
    ax.axis("off")
    # the pipeline: one warm worker per stage
    box(ax, 5.5, STAGE_Y + 0.35, 11.7, 2.4, "#f3f6fb", "#9fb3d1")
    ax.text(
        -0.25,
        STAGE_Y + 1.32,
        "Kubeflow Pipelines v2: one warm worker per stage (KFP's local runner by default, "
        "or a cluster's node pools)",
        fontsize=9.5,
        color="#38506e",
        va="center",
    )
    for name, x, does, where in STAGES:
        box(ax, x, STAGE_Y, 2.3, 1.25, "white", "#38506e")
        ax.text(x, STAGE_Y + 0.35, name, ha="center", va="center", fontsize=12, weight="bold")
        ax.text(x, STAGE_Y - 0.02, does, ha="center", va="center", fontsize=8.5)
        ax.text(x, STAGE_Y - 0.42, where, ha="center", va="center", fontsize=7.5, color="#555")
    # the store: the only channel between stages
    box(ax, 5.5, STORE_Y, 11.7, 1.5, "#fbf6ec", "#c9a45c")
    ax.text(
        -0.25,
        STORE_Y - 0.55,
        "object store (a local directory or S3): Parquet and safetensors, each output "
        "committed by a _SUCCESS manifest",
        fontsize=9.5,
        color="#7a5a17",
        va="center",
    )
    for label, x in ARTIFACTS:
        box(ax, x, STORE_Y + 0.05, 1.95, 0.62, "white", "#c9a45c")
        ax.text(x, STORE_Y + 0.05, label, ha="center", va="center", fontsize=7.8)
    for src, dst in FLOWS:
        ax.add_patch(
            FancyArrowPatch(
                point(*src),
                point(*dst),
                arrowstyle="-|>",
                mutation_scale=11,
                color="#38506e" if src[0] == "s" else "#a07d2c",
                linewidth=1.1,
                shrinkA=2,
                shrinkB=2,
            )
        )
    # the optional direct path of new weights
    ax.add_patch(
        FancyArrowPatch(
            (STAGES[2][1], STAGE_Y + 0.64),
            (STAGES[0][1], STAGE_Y + 0.64),
            connectionstyle="arc3,rad=0.1",
            arrowstyle="-|>",
            mutation_scale=11,
            color="#c2185b",
            linestyle="--",
            linewidth=1.1,
        )
    )
    ax.text(
        4.0,
        STAGE_Y + 0.72,
        "weight channel (optional): NCCL / gloo",
        ha="center",
        fontsize=8,
        color="#c2185b",
    )
    ax.text(
        5.5,
        -0.35,
        "reads go up, writes go down; nothing passes between stages but URIs",
        ha="center",
        fontsize=8.5,
        color="#555",
    )
    FigureCanvasAgg(fig)
    fig.savefig(OUT, dpi=110, metadata={"Software": None})
    return OUT


if __name__ == "__main__":
    print(main())
