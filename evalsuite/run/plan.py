"""What `evalsuite run` is about to do, printed before it starts, with an estimate of how long it will take.

The estimate adds, over every pending (method, turn) decode: the target's prefill of the turn's new context tokens
at their place in the context, and `--max-new-tokens` × `--repeats` tokens at the method's cost per token at that
context. The costs are measured on this machine just before the run, at the contexts the plan reaches:
- the target's one-token forward at a short context and at the plan's longest (a line through both: attention
  reads the whole cache);
- its prefill rate per token from the start and after that longest context (a line in the offset, so a long
  prefill costs what its growing attention costs);
- each method's cost per token relative to `ar`: from the turns a resumed run has stored already (paired, binned
  by context: τ and the verify's price both move with it), else from the warm-up's one short prompt.
A long context is measured over random K/V written into the cache (`fill_synthetic`: attention costs the same
whatever the values) rather than prefilled, so the measurement takes seconds at 32k. Turns that end early (an EOS)
take less, and drafting methods whose τ differs from the one measured go faster or slower: it is an estimate, not
a bound. A plan over an hour also offers a sized command that fits in about ten minutes.
"""

from __future__ import annotations

import random
import shlex
import statistics
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from evalsuite import metrics
from evalsuite.conventions import BASELINE, SKIPPED
from evalsuite.run.resume import program
from evalsuite.tasks.base import LoadOptions
from evalsuite.timing import DeviceClock

SIZED_TARGET_S = 600.0  # a sized command aims at about this long
LONG_PLAN_S = 3600.0  # plans over this get a sized command
PLACEHOLDER_WORD = " step"  # stands in for a reply the model has not written yet (one token per word)


@dataclass
class Costs:
    """Measured costs of this target on this machine (seconds)."""

    decode_short_s: float  # one-token forward at `short` tokens of context
    decode_long_s: float  # … at `long` tokens
    short: int
    long: int
    prefill_per_token_s: float  # per token of a prefill of `prefill_tokens` tokens from the start
    method_ratio: dict[str, float] = field(default_factory=dict)  # method s/token ÷ ar s/token in the warm-up
    prefill_tokens: int = 0
    prefill_long_per_token_s: float | None = None  # per token of a chunk of `prefill_tokens` after `long` tokens
    synthetic: bool = False  # the long context held random K/V instead of a prefill
    stored_ratio: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)  # stored_ratios()

    def ratio(self, method: str, context: int) -> float:
        """A method's seconds per token ÷ ar's at `context`: from the run's stored turns where it has some (their
        binned medians, interpolated in context, flat past the ends), else from the warm-up."""
        if method in self.stored_ratio:
            contexts, ratios = self.stored_ratio[method]
            return float(np.interp(context, contexts, ratios))
        return self.method_ratio.get(method, 1.0)

    def decode_s(self, context: int) -> float:
        slope = (self.decode_long_s - self.decode_short_s) / max(self.long - self.short, 1)
        return max(self.decode_short_s + slope * (context - self.short), self.decode_short_s)

    def prefill_rate_s(self, offset: float) -> float:
        """Seconds per prefilled token whose chunk is centred `offset` tokens into the context."""
        start = self.prefill_tokens / 2
        if self.prefill_long_per_token_s is None:
            return self.prefill_per_token_s
        end = self.long + self.prefill_tokens / 2
        slope = (self.prefill_long_per_token_s - self.prefill_per_token_s) / max(end - start, 1.0)
        floor = min(self.prefill_per_token_s, self.prefill_long_per_token_s)
        return max(self.prefill_per_token_s + slope * (offset - start), floor)

    def prefill_s(self, start: int, tokens: int) -> float:
        """A prefill of `tokens` new tokens after `start` cached ones: each at the rate of its chunk's middle."""
        return tokens * self.prefill_rate_s(start + tokens / 2) if tokens > 0 else 0.0

    def describe(self) -> str:
        ratios = ", ".join(f"{m} {r:.2f}×" for m, r in self.method_ratio.items()
                           if m != BASELINE and m not in self.stored_ratio)
        stored = ", ".join(f"{m} {min(r):.2f}–{max(r):.2f}×" for m, (_, r) in self.stored_ratio.items())
        if stored:
            spans = [c for contexts, _ in self.stored_ratio.values() for c in contexts]
            stored = (f"; per token against ar in the stored turns ({min(spans):,.0f}–{max(spans):,.0f} tokens "
                      f"of context): {stored}")
        synthetic = " (random K/V in the cache)" if self.synthetic else ""
        prefill = f"prefill {1e3 * self.prefill_per_token_s:.2f} ms/token"
        if self.prefill_long_per_token_s is not None:
            prefill += f" from the start, {1e3 * self.prefill_long_per_token_s:.2f} after {self.long:,} tokens"
        return (f"measured: ar {1e3 * self.decode_short_s:.0f} ms/token at {self.short:,} tokens of context, "
                f"{1e3 * self.decode_long_s:.0f} ms at {self.long:,}{synthetic}; {prefill}"
                + stored + (f"; per token against ar in the warm-up: {ratios}" if ratios else ""))


@dataclass
class Plan:
    samples: int  # selected samples
    pending_samples: int  # samples with at least one unfinished (method, sample) pair
    turns: list[int]  # pending turns per pending sample (after --max-turns)
    methods: list[str]  # methods decoded (the `ar` baseline included)
    decodes: int  # pending (method, turn) decodes
    done_turns: int  # (method, turn) rows already stored and skipped
    max_new_tokens: int
    repeats: int
    estimate_s: float | None  # None: no estimate (an engine without a target here)
    prefill_s: float = 0.0  # the estimate's prefill part
    costs: Costs | None = None
    sized: str = ""  # a command that fits in about ten minutes, when the plan is long

    @property
    def tokens(self) -> int:
        """New tokens if every decode ran to --max-new-tokens (repeats included): the progress bar's total."""
        return self.decodes * self.max_new_tokens * self.repeats

    def describe(self) -> str:
        per_sample = " + ".join(str(t) for t in self.turns[:6]) + (" + …" if len(self.turns) > 6 else "")
        done = f"; {self.done_turns} stored (method, turn) decodes skipped" if self.done_turns else ""
        text = (f"plan: {self.pending_samples} of {self.samples} samples to run, {sum(self.turns)} turns in all "
                f"({per_sample}); {self.decodes} turn decodes over {len(self.methods)} methods "
                f"({', '.join(self.methods) or '-'}), up to {self.max_new_tokens} new tokens each"
                + (f", {self.repeats} repeats" if self.repeats > 1 else "") + done)
        if self.estimate_s is not None:
            text += (f"; estimated {format_duration(self.estimate_s)} (prefill {format_duration(self.prefill_s)}; "
                     f"{self.costs.describe()})")
        return text

    def advice(self) -> str:
        """One line for a long plan, with the sized command."""
        if self.estimate_s is None or self.estimate_s <= LONG_PLAN_S:
            return ""
        line = f"this plan takes over an hour here (estimated {format_duration(self.estimate_s)})"
        return line + (f"; about ten minutes: {self.sized}" if self.sized else "")


def make_plan(runner, warmup_costs: dict[str, float] | None = None) -> Plan:
    """The plan of a loaded `Runner` for its pending decodes; `warmup_costs`: method → s/token in the warm-up."""
    cfg = runner.config
    units = runner.pending_units()
    per_turn = {u.trajectory.sample_id: pending_turns(runner, u) for u in units}
    turns = [len(t) for t in per_turn.values()]
    decodes = sum(len(methods) for t in per_turn.values() for _, _, methods in t)
    stored = sum(len(rows) for rows in runner.stored.values())
    methods = [m for m in runner.methods if any(m in u.methods for u in units)]
    target = getattr(runner.engine, "target", None)
    plan = Plan(len(runner.trajectories), len(units), turns, methods, decodes, stored, cfg.max_new_tokens,
                cfg.repeats, None)
    if target is None or not units:
        return plan
    longest = max((context for turns_ in per_turn.values() for context, _, _ in turns_), default=0)
    plan.costs = measure_costs(target, warmup_costs or {}, longest)
    plan.costs.stored_ratio = stored_ratios(runner.stored)
    estimates = {sample: turn_costs(plan.costs, turns_, cfg) for sample, turns_ in per_turn.items()}
    plan.estimate_s = sum(sum(total for total, _ in est) for est in estimates.values())
    plan.prefill_s = sum(sum(prefill for _, prefill in est) for est in estimates.values())
    if plan.estimate_s > LONG_PLAN_S:
        plan.sized = sized_command(runner, estimates)
    return plan


def pending_turns(runner, unit) -> list[tuple[int, int, list[str]]]:
    """(context tokens, new context tokens to prefill, methods to decode) per turn of a unit that has a decode.
    Contexts follow the run's replay; a reply not written yet is a placeholder of --max-new-tokens tokens (in a
    closed loop it calls no tool, so the plan counts one decode per user turn: a lower bound)."""
    trajectory = unit.trajectory
    replay = runner.replays(trajectory, (BASELINE,))[BASELINE]
    stored = {m: {row.turn for row in runner.stored.get((m, trajectory.sample_id), [])} for m in unit.methods}
    placeholder = PLACEHOLDER_WORD * runner.config.max_new_tokens
    found, previous, turn = [], 0, 0
    while replay.has_turn(turn):
        context = replay.context(turn)
        methods = metrics.with_baseline(m for m in unit.methods if turn not in stored[m])  # ar again, for pairing
        if methods and not context.skipped:
            found.append((context.context_len, max(context.context_len - previous, 0), methods))
            previous = context.context_len
        replay.record_reply(turn, None if context.skipped else placeholder)
        turn += 1
    return found


def turn_costs(costs: Costs, turns: list[tuple[int, int, list[str]]], cfg) -> list[tuple[float, float]]:
    """(estimated seconds, of which prefill) per pending turn."""
    found = []
    for context, fresh, methods in turns:
        prefill = costs.prefill_s(context - fresh, fresh)
        decode = sum(costs.ratio(m, context) for m in methods) * costs.decode_s(context)
        found.append((prefill + decode * cfg.max_new_tokens * cfg.repeats, prefill))
    return found


STORED_BINS = 8  # at most this many context bins per method in stored_ratios
STORED_MIN_ROWS = 3  # rows per bin at least


def stored_ratios(stored: dict[tuple[str, str], list]) -> dict[str, tuple[list[float], list[float]]]:
    """Per drafting method with at least STORED_MIN_ROWS decoded, uncontended stored turns: its paired time per
    token ÷ ar's on the same turn (1 / speedup_turn), as (median context, median ratio) of up to STORED_BINS bins
    of equal counts in context order. What a resumed run has measured already is a better guide than the
    warm-up's one short prompt: τ and the verify's cost both move with the context."""
    rows: dict[str, list[tuple[float, float]]] = {}
    for (method, _), turns in stored.items():
        if method == BASELINE:
            continue
        for row in turns:
            speedup = row.speedup_turn  # read_run fills what older runs lack (contended: False)
            if row.stop_reason == SKIPPED or row.contended or not speedup > 0:
                continue
            rows.setdefault(method, []).append((float(row.context_len), 1.0 / float(speedup)))
    lines = {}
    for method, found in rows.items():
        if len(found) < STORED_MIN_ROWS:
            continue
        found.sort()
        bins = np.array_split(np.array(found), min(STORED_BINS, len(found) // STORED_MIN_ROWS))
        lines[method] = ([float(np.median(b[:, 0])) for b in bins], [float(np.median(b[:, 1])) for b in bins])
    return lines


def measure_costs(target, warmup_costs: dict[str, float], longest: int = 0, repeats: int = 5) -> Costs:
    """The target's one-token forward at a short context and at the plan's `longest` (at least a prefill's
    length), and its prefill rate from the start and after `longest`, measured now. Past the prefill's length
    the cache holds random K/V (`fill_synthetic`) where it can; a cache that cannot (`--kv-cache dynamic`) is
    prefilled, up to PREFILLED_MAX tokens, and the lines are extended from there."""
    short = 64
    chunk = max(short * 2, min(1024, target.max_context // 4))
    decode_short, _ = _forward_s(target, short, repeats)
    decode_chunk, prefill_s = _forward_s(target, chunk, repeats)
    ratio = {m: (s / warmup_costs[BASELINE] if warmup_costs.get(BASELINE) else 1.0) for m, s in warmup_costs.items()}
    costs = Costs(decode_short, decode_chunk, short, chunk, prefill_s / chunk, ratio, chunk)
    long = min(longest, target.max_context - chunk - repeats - 2)
    if long > chunk + chunk // 2:
        decode_long, long_prefill_s, synthetic, long = _after_s(target, long, chunk, repeats)
        if long > chunk + chunk // 2:  # (a prefilled context is capped at PREFILLED_MAX)
            costs = replace(costs, decode_long_s=decode_long, long=long, synthetic=synthetic,
                            prefill_long_per_token_s=long_prefill_s / chunk)
    return costs


PREFILLED_MAX = 4096  # the longest context a cache without `fill_synthetic` is prefilled to for the estimate


def _forward_s(target, context: int, repeats: int) -> tuple[float, float]:
    """(median one-token forward s after `context` tokens, the prefill's s)."""
    cache = target.new_cache()
    cache.reserve(context + repeats + 2)
    ids = _ids(target, context)
    prefill_s, _ = DeviceClock(target.device).time(lambda: target.forward(ids, cache, last_only=True))
    return _decodes_s(target, cache, ids[-1:].clone(), repeats), prefill_s


def _after_s(target, context: int, chunk: int, repeats: int) -> tuple[float, float, bool, int]:
    """(median one-token forward s, s of a `chunk`-token prefill, whether the K/V were random, the context) after
    `context` tokens: random K/V where the cache can hold them, else a prefill of at most PREFILLED_MAX tokens."""
    cache = target.new_cache()
    synthetic = hasattr(cache, "fill_synthetic")
    if synthetic:
        cache.fill_synthetic(target.config, 1, context, target.dtype, target.device, room=chunk + repeats + 2)
    else:
        context = min(context, PREFILLED_MAX)
        cache.reserve(context + chunk + repeats + 2)
        target.forward(_ids(target, context), cache, last_only=True)
    ids = _ids(target, chunk)
    decode = _decodes_s(target, cache, ids[-1:].clone(), repeats)
    prefill_s, _ = DeviceClock(target.device).time(lambda: target.forward(ids, cache, last_only=True))
    cache.crop_to(0)
    return decode, prefill_s, synthetic, context


def _decodes_s(target, cache, token: torch.Tensor, repeats: int) -> float:
    """Median of `repeats` one-token forwards after two untimed ones, each cropped back to the same context."""
    clock = DeviceClock(target.device)
    length = cache.get_seq_length()
    times = []
    for _ in range(repeats + 2):
        times.append(clock.time(lambda: target.forward(token, cache))[0])
        cache.crop_to(length)
    return statistics.median(times[2:])


def _ids(target, count: int) -> torch.Tensor:
    return torch.arange(count, device=target.device) % max(target.vocab_size, 1)


def sized_command(runner, estimates: dict[str, list[tuple[float, float]]]) -> str:
    """`--limit L --max-turns T` (the first L samples of the seeded order, T turns each) estimated at about
    SIZED_TARGET_S, preferring at least 3 samples (the report's intervals need them), then the most decodes."""
    cfg = runner.config
    shuffled = [t.sample_id for t in runner.task.load(LoadOptions(None, cfg.seed, cfg.data_path, cfg.subset))]
    random.Random(cfg.seed).shuffle(shuffled)  # the order `--limit` takes samples in (tasks.base.seeded_subset)
    pending = [s for s in shuffled if s in estimates]
    cap = max((len(e) for e in estimates.values()), default=1)
    best = None
    for turns in sorted({cap, 16, 8, 4, 2, 1}, reverse=True):
        if turns > cap:
            continue
        total, count = 0.0, 0
        for sample in pending:
            cost = sum(seconds for seconds, _ in estimates[sample][:turns])
            if total + cost > SIZED_TARGET_S:
                break
            total, count = total + cost, count + 1
        if count:
            decodes = count * turns
            key = (count >= 3, decodes)
            if best is None or key > best[0]:
                best = (key, count, turns, total)
    if best is None:
        return ""
    _, count, turns, total = best
    requested = replace(cfg, threads=getattr(runner, "threads_requested", cfg.threads))
    args = ["run", *config_args(requested, skip=("limit", "max_turns", "sample_ids", "out", "resume")),
            "--limit", str(count), "--max-turns", str(turns)]
    return f"{shlex.join(program() + args)} (estimated {format_duration(total)})"


def config_args(config, skip: tuple[str, ...] = ()) -> list[str]:
    """The `evalsuite run` options that give `config` (those that differ from the defaults)."""
    defaults = type(config)(methods=[], task="")
    args = ["--method", ",".join(config.methods), "--task", config.task]
    for name in config.__dataclass_fields__:
        value = getattr(config, name)
        if name in ("methods", "task") + tuple(skip) or value == getattr(defaults, name):
            continue
        flag = "--" + name.replace("_", "-")
        if name == "drafters":
            args += [item for method, path in value.items() for item in ("--drafter", f"{method}={path}")]
        elif name == "method_options":
            args += [item for method, options in value.items() for key, setting in options.items()
                     for item in ("--method-option", f"{method}.{key}={setting}")]
        elif name == "sample_ids":
            args += [flag, ",".join(value)]
        elif isinstance(value, bool):
            args.append(flag if value else f"--no-{name.replace('_', '-')}")
        elif value is not None:
            args += [flag, str(value)]
    return args


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
