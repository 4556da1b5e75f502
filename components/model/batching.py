"""Which rows a generate call decodes when, and the state of its decode (the transformers backend).

A call's rows are its prompts' samples, in the backend's order (prompts sorted by length, a
prompt's n samples together): row ``p * n + j`` is sample j of the p-th prompt. Rows join the
decode a whole prompt at a time, by one of two admissions:

- `Planned` (static batching): the next planned batch joins once every row of the last one has
  finished, so each batch waits for its longest sample;
- `Continuous` (continuous batching, `generate.transformers.continuous_batching`): prompts join as soon as the
  rows that finished leave room for them, so a long sample holds only its own row.

Every row draws its tokens from its own uniform stream (token_sampling.py), so which rows share a
step changes its samples only by the rounding of the logits (docs/contracts.md, "Batch and shard
invariance"). A prompt's samples are yielded once all n have finished: with `Planned`, a batch's
prompts together, in order; with `Continuous`, as they complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from components.model.backends import cut_at_stop


class Planned:
    """Static batching: the batches planned up front, each joining when the last has finished."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes  # prompts per batch, in order
        self.next = 0  # the next prompt to join
        self.batch = 0

    def take(self, active: int) -> int:
        """How many prompts join now, from `next` on (`active` rows are decoding)."""
        if active or self.batch == len(self.sizes):
            return 0
        self.batch += 1
        return self._joined(self.sizes[self.batch - 1])

    def wants(self, active: int) -> bool:
        """Whether to stop a decode stretch so that prompts can join (never mid-batch)."""
        return False

    def flush(self, active: int) -> bool:
        """Whether to yield the finished prompts now: at a batch's end."""
        return active == 0

    streams = False
    """Whether a decode stretch ends as soon as rows leave, so their prompts are yielded then."""

    def _joined(self, k: int) -> int:
        self.next += k
        return k


class Continuous(Planned):
    """Continuous batching: up to `rows` rows decode at once; whole prompts join whenever their n
    rows fit, once an eighth of the rows (at least one prompt's) is free, so that a join's
    prefill and cache copy serve several finished rows."""

    def __init__(self, prompts: int, n: int, rows: int) -> None:
        super().__init__([])
        self.prompts, self.n, self.rows = prompts, n, max(rows, n)

    def take(self, active: int) -> int:
        if not self.wants(active):
            return 0
        return self._joined(min((self.rows - active) // self.n, self.prompts - self.next))

    def wants(self, active: int) -> bool:
        free = self.rows - active
        return self.next < self.prompts and free >= max(self.n, self.rows // 8 if active else 0)

    def flush(self, active: int) -> bool:
        return True

    streams = True


@dataclass
class DecodeState:
    """One call's decode. Rows decode in slots: `tokens`, `logps` [S, T] and `lengths`,
    `finished`, `stopped` [S] hold the rows in the S slots (as many as decode at once); the
    per-step tensors (`act`, the active rows' slots, with their `steps` drawn so far, `uniforms`
    [A, T], `logits`, `next_pos` and the KV `cache`) hold the active rows only. A row that
    leaves is copied to the host (`left`, by row) and its slot is free for the next."""

    T: int  # max_new_tokens
    pad: int
    tokens: torch.Tensor
    logps: torch.Tensor
    lengths: torch.Tensor
    finished: torch.Tensor
    stopped: torch.Tensor
    act: torch.Tensor
    steps: torch.Tensor
    uniforms: torch.Tensor
    next_pos: torch.Tensor
    logits: torch.Tensor | None = None
    cache: object = None  # a kv_cache.DecodeCache while rows are active
    row_of: dict[int, int] = field(default_factory=dict)
    """{slot: the call's row in it}"""
    free: list[int] = field(default_factory=list)
    left: dict[int, tuple[list[int], list[float], bool]] = field(default_factory=dict)
    """{row: (token ids, logprobs, whether it stopped)} of the rows that left."""

    @classmethod
    def empty(cls, slots: int, T: int, pad: int, device) -> DecodeState:
        def zeros(*shape, dtype=torch.long):
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            T=T,
            pad=pad,
            tokens=torch.full((slots, T), pad, dtype=torch.long, device=device),
            logps=zeros(slots, T, dtype=torch.float32),
            lengths=zeros(slots),
            finished=zeros(slots, dtype=torch.bool),
            stopped=zeros(slots, dtype=torch.bool),
            act=zeros(0),
            steps=zeros(0),
            uniforms=zeros(0, T, dtype=torch.float64),
            next_pos=zeros(0),
            free=list(range(slots)),
        )

    def join(
        self,
        rows: list[int],
        uniforms: torch.Tensor,
        logits: torch.Tensor,
        next_pos: torch.Tensor,
    ) -> None:
        """Rows `rows` join after the active ones, in free slots, with their first step's
        logits."""
        slots, self.free = self.free[: len(rows)], self.free[len(rows) :]
        self.row_of.update(zip(slots, rows, strict=True))
        at = torch.tensor(slots, dtype=torch.long, device=self.act.device)
        self.tokens[at], self.logps[at], self.lengths[at] = self.pad, 0.0, 0
        self.finished[at], self.stopped[at] = False, False
        self.act = torch.cat([self.act, at])
        self.steps = torch.cat([self.steps, torch.zeros_like(at)])
        self.uniforms = torch.cat([self.uniforms, uniforms])
        self.logits = logits if self.logits is None else torch.cat([self.logits, logits])
        self.next_pos = torch.cat([self.next_pos, next_pos])

    def draws(self) -> torch.Tensor:
        """Each active row's uniform for the token it draws now."""
        at = self.steps.clamp(max=self.T - 1).unsqueeze(-1)
        return self.uniforms.gather(1, at).squeeze(-1)

    def record(self, tok: torch.Tensor, lp: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
        """This step's draws of the active rows: kept where the row was live, which ends at eos
        (a finished row's entries stay as they are). Returns which active rows were live and did
        not draw eos (a stop string may end them)."""
        act, at = self.act, self.steps.clamp(max=self.T - 1)
        live = ~self.finished[act]
        self.tokens[act, at] = torch.where(live, tok, self.tokens[act, at])
        self.logps[act, at] = torch.where(live, lp, self.logps[act, at])
        self.lengths[act] += live
        hit_eos = torch.isin(tok, eos) & live
        self.finished[act] = self.finished[act] | hit_eos
        self.stopped[act] = self.stopped[act] | hit_eos
        return live & ~hit_eos

    def advance(self) -> None:
        """Count the step; a row that has drawn max_new_tokens has finished."""
        self.steps = self.steps + 1
        self.finished[self.act] = self.finished[self.act] | (self.steps >= self.T)

    def check_stop(
        self, tokenizer, open_rows: torch.Tensor, stop: tuple[str, ...], window: int
    ) -> None:
        """End the rows of `open_rows` (a mask over the active rows) whose text holds a stop
        string after this step. Text-level, per row, over the last tokens only (`stop_in_tail`):
        a stop string that completes at this step lies within them (every earlier step was
        checked), and decoding the whole response each step costs O(T^2) per row."""
        for i, t in zip(self.act[open_rows].tolist(), self.steps[open_rows].tolist(), strict=True):
            if stop_in_tail(tokenizer, self.tokens[i], t + 1, stop, window):
                self.finished[i] = True
                self.stopped[i] = True

    def drop_finished(self, tok: torch.Tensor, done: torch.Tensor) -> tuple[torch.Tensor, list]:
        """Keep only the active rows not done, in the per-step tensors and the KV cache; returns
        this step's `tok` of the kept rows and the rows that left."""
        keep = torch.nonzero(~done).flatten()
        gone = self._leave(self.act[done])
        self.cache.select(keep)
        self.act, tok, self.steps = self.act[keep], tok[keep], self.steps[keep]
        self.next_pos, self.uniforms = self.next_pos[keep], self.uniforms[keep]
        return tok, gone

    def retire_all(self) -> list:
        """Every active row has finished: they all leave (with the cache). Returns them."""
        gone = self._leave(self.act)
        self.act, self.steps = self.act[:0], self.steps[:0]
        self.next_pos, self.uniforms = self.next_pos[:0], self.uniforms[:0]
        self.logits = self.cache = None
        return gone

    def _leave(self, slots: torch.Tensor) -> list[int]:
        """The rows in `slots` leave: their tokens to the host, their slots free."""
        tokens, logps = self.tokens[slots].cpu(), self.logps[slots].cpu()
        lengths, stopped = self.lengths[slots].tolist(), self.stopped[slots].tolist()
        gone = []
        for k, slot in enumerate(slots.tolist()):
            row = self.row_of.pop(slot)
            n = lengths[k]
            self.left[row] = (tokens[k, :n].tolist(), logps[k, :n].tolist(), stopped[k])
            self.free.append(slot)
            gone.append(row)
        self.free.sort()
        return gone


def stop_window(stop: tuple[str, ...]) -> int:
    """Tokens first decoded when looking for a stop string that completes at the newest token.

    Most tokens decode to at least one character; special tokens (skipped) and the bytes of a
    character split across byte-level BPE tokens do not, so twice the longest stop string's
    length plus a margin usually suffices, and `stop_in_tail` widens it where it does not."""
    return 2 * max((len(s) for s in stop), default=0) + 8


def stop_in_tail(tokenizer, row, end: int, stop: tuple[str, ...], window: int) -> bool:
    """Whether the text of ``row[:end]`` contains a stop string, decoding only its last tokens.

    Starts from the last `window` tokens and widens the window (to the whole row at most) until
    its text holds the longest stop string plus the newest token's text: special tokens decode to
    nothing and a character split across byte-level BPE tokens takes several, so a fixed count
    of tokens can hold fewer characters than a stop string that completed at the newest token
    (a run of skipped special tokens inside "\n\n", a stop string of CJK characters). The
    replacement characters of a character cut at the window's start do not count."""
    longest = max(len(s) for s in stop)
    need = longest + len(tokenizer.decode(row[end - 1 : end], skip_special_tokens=True))
    lo = max(0, end - window)
    while True:
        text = tokenizer.decode(row[lo:end], skip_special_tokens=True)
        if lo == 0 or len(text.lstrip("\ufffd")) >= need:
            return cut_at_stop(text, stop)[1]
        lo = max(0, lo - max(window, end - lo))  # double the window
