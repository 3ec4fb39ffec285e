"""What `evalsuite run` is about to do, printed before it starts: samples × turns × methods, the token budget,
and a time estimate from a quick measured target forward."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


@dataclass
class Plan:
    samples: int  # selected samples
    pending_samples: int  # samples with at least one unfinished (method, sample) pair
    turns: int  # turns to replay over the pending samples (after --max-turns)
    methods: list[str]  # methods decoded (the `ar` baseline included when it is needed for pairing)
    decodes: int  # turn decodes: Σ over pending samples of turns × methods decoded on it
    done_pairs: int  # (method, sample) pairs already finished and skipped
    max_new_tokens: int
    token_s: float  # seconds per single-token target forward, measured at a short context

    @property
    def tokens(self) -> int:
        """Upper bound on the tokens to generate: every turn decode runs to --max-new-tokens."""
        return self.decodes * self.max_new_tokens

    @property
    def estimate_s(self) -> float:
        """Upper bound at AR speed (one target forward per token); drafting methods need fewer forwards."""
        return self.tokens * self.token_s

    def describe(self) -> str:
        skipped = f" ({self.done_pairs} finished pairs skipped)" if self.done_pairs else ""
        return (f"plan: {self.pending_samples} of {self.samples} samples × {self.turns} turns × "
                f"{len(self.methods)} methods ({', '.join(self.methods) or '-'}) = {self.decodes} turn decodes"
                f"{skipped}; ≤ {self.tokens:,} new tokens; ≤ {format_duration(self.estimate_s)} at AR speed "
                f"({self.token_s * 1e3:.1f} ms per target forward, measured)")


def make_plan(runner) -> Plan:
    """The plan of a loaded `Runner` for its pending (method, sample) pairs."""
    cap = runner.config.max_turns or 10**9
    units = runner.pending_units()
    finished = sum(runner.is_finished(m, t.sample_id) for t in runner.trajectories for m in runner.methods)
    turns = sum(min(len(u.trajectory.turns), cap) for u in units)
    decodes = sum(min(len(u.trajectory.turns), cap) * len(u.methods) for u in units)
    methods = [m for m in runner.methods if any(m in u.methods for u in units)]
    target = getattr(runner.engine, "target", None)
    token_s = measure_forward(target) if units and target is not None else 0.0
    return Plan(len(runner.trajectories), len(units), turns, methods, decodes, finished,
                runner.config.max_new_tokens, token_s)


def measure_forward(target, context: int = 64, repeats: int = 5) -> float:
    """Median seconds of a one-token target forward after a short context (the first calls are not timed)."""
    cache = target.new_cache()
    cache.reserve(context + repeats + 2)
    ids = torch.arange(context, device=target.device) % max(target.vocab_size, 1)
    target.forward(ids, cache, last_only=True)
    token = ids[-1:].clone()
    times = []
    for i in range(repeats + 2):
        if target.device.type == "cuda":
            torch.cuda.synchronize(target.device)
        start = time.perf_counter()
        target.forward(token, cache)
        if target.device.type == "cuda":
            torch.cuda.synchronize(target.device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
