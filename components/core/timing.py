"""Where a step's time goes: its spans (start, wait, load, read, work, commit), recorded in its
manifest (components/evaluate/timeline.py reads them back into a run's chart)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


def process_start_time() -> float:
    """When this process started (epoch seconds): the start of its cold-start span."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # starttime, in clock ticks after boot
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


_IMPORTED_AT = time.time()


@dataclass
class Timeline:
    """Spans of one step, in epoch seconds: [name, start, end]. Recorded in its manifest."""

    task: str
    iteration: int
    spans: list[list[Any]] = field(default_factory=list)
    one_shot: bool = False
    """Run alone (`rlvr stage`, a one-stage pipeline), not by a run's warm worker: a rerun,
    perhaps long after the run, which the run's timeline leaves out of its wall time."""

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        t0 = time.time()
        try:
            yield
        finally:
            self.spans.append([name, t0, time.time()])

    def add(self, name: str, start: float, end: float) -> None:
        self.spans.append([name, start, end])

    def carve(self, name: str, intervals: list[tuple[float, float]]) -> None:
        """Record `intervals` (an evaluation's waits for its turn) as spans `name`, cut out of
        the spans they overlap, which keep the rest; the part of an interval that overlaps no
        span is not this step's and is dropped. A step's spans do not nest."""
        for a, b in intervals:
            out: list[list[Any]] = []
            for kind, s, e in self.spans:
                lo, hi = max(s, a), min(e, b)
                if kind == name or lo >= hi:
                    out.append([kind, s, e])
                    continue
                pieces = [[kind, s, lo], [name, lo, hi], [kind, hi, e]]
                out += [p for p in pieces if p[2] > p[1]]
            self.spans = out

    def seconds(self, name: str) -> float:
        return sum(e - s for n, s, e in self.spans if n == name)

    def record(self) -> dict[str, Any]:
        """The manifest entry: spans plus where they ran."""
        return {
            "task": self.task,
            "iteration": self.iteration,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "spans": [list(s) for s in self.spans],
            "seconds": {
                n: round(self.seconds(n), 6) for n in dict.fromkeys(s[0] for s in self.spans)
            },
        } | ({"one_shot": True} if self.one_shot else {})
