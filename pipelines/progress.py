"""What `rlvr run` shows while a segment runs: live progress read from the store.

Progress comes from the store, not from the workers' output: one bar per stage, advanced as the
stage's commits land (rollouts, scored rollouts, checkpoints, evaluations of the segment). The
workers' own log lines stream above the bars, prefixed with the task name.
"""

from __future__ import annotations

import threading

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from components.core.config import RunConfig
from components.core.layout import RunLayout, store_for
from components.core.store import StoreError
from components.core.warm import Segment, is_committed, segment_eval_checkpoints


class RunMonitor:
    """A rich progress display of one segment, refreshed from the store by a thread."""

    def __init__(self, cfg: RunConfig, seg: Segment, console: Console, every_s: float = 0.5):
        self.cfg, self.seg, self.every_s = cfg, seg, every_s
        self.store, self.layout = store_for(cfg), RunLayout.of(cfg)
        self.progress = Progress(
            TextColumn("{task.description:>10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        lay, its = self.layout, list(seg.iterations)
        self.watch = {
            "generate": [lay.rollouts(i) for i in its],
            "verify": [lay.scored(i) for i in its],
            "train": [lay.checkpoint(i + 1) for i in its],
        }
        if cfg.data.evaluates:
            self.watch["evaluate"] = [lay.evals(c) for c in segment_eval_checkpoints(cfg, seg)]
        self.bars = {
            name: self.progress.add_task(name, total=len(uris)) for name, uris in self.watch.items()
        }
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def refresh(self) -> None:
        for name, uris in self.watch.items():
            try:
                done = sum(is_committed(self.store, u) for u in uris)
            except StoreError:
                continue
            self.progress.update(self.bars[name], completed=done)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.refresh()

    def __enter__(self) -> RunMonitor:
        self.progress.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.refresh()
        self.progress.stop()
