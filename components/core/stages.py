"""The stages' names, defined once.

Four stages, each its own container image and worker, in pipeline order; an RL iteration is the
first three; `init` (copying the base policy and the data into the run) runs on the init image
before them. Configs, the CLI, the pipelines, the local runners and the run report all take
their lists from here.
"""

from __future__ import annotations

STAGES: tuple[str, ...] = ("generate", "verify", "train", "evaluate")
ITERATION_STAGES: tuple[str, ...] = ("generate", "verify", "train")
STEPS: tuple[str, ...] = ("init", *STAGES)
