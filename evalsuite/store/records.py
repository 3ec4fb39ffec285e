"""The typed data that flows from an engine to the store: what an engine measures (`Step`, `TurnResult`) and the
rows the store keeps (`StepRecord`, `TurnRecord`), each row built once from a result. The measures derived from a
result (τ, the pairing with `ar`, the degenerate flag) come from `metrics` and `degenerate`, through the runner.

No torch, no I/O: engines, the runner, the store and the reports all import these types.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import pyarrow as pa

from evalsuite.conventions import SKIPPED


@dataclass
class Step:
    """One verify step as an engine measured it. Engines without per-step timings (vLLM) leave them None."""

    context_len: int  # the target's KV length when the step starts (tokens it has already processed)
    num_drafted: int
    num_accepted: int  # accepted drafts, bonus excluded; drafts after an accepted EOS draft are not counted
    emitted: int  # tokens this step added to the output (accepted + bonus, less any cut at EOS/limit)
    draft_s: float | None = None  # drafter work: propose + commit
    verify_s: float | None = None  # the target's verify forward
    step_s: float | None = None  # whole step: draft + verify + acceptance, KV rollback and bookkeeping
    draft_state_bytes: int | None = None  # draft-side memory after the step: history + working
    draft_history_bytes: int | None = None  # the part of it that grows with the context
    budget_limited: bool = False  # the token budget or the window left no room to draft; excluded from τ


@dataclass
class TurnResult:
    """One decoded turn, as an engine returns it."""

    output_ids: list[int]
    steps: list[Step] = field(default_factory=list)
    prefill_tokens: int = 0  # tokens the target actually prefilled (the rest came from its prefix cache)
    prefill_s: float | None = 0.0
    draft_prefill_s: float | None = 0.0  # the drafter's start-of-turn work (e.g. building its KV over the context)
    decode_s: float = 0.0  # everything after the target prefill: start-of-turn work + every step
    stop_reason: str = "max_new_tokens"  # eos | max_new_tokens | context_limit
    repeat_decode_s: list[float] = field(default_factory=list)  # decode_s of every --repeats decode (timing noise)


@dataclass(frozen=True)
class TurnKey:
    """Which row: the run, method, task, sample and turn."""

    run_id: str
    method: str
    task: str
    sample_id: str
    turn: int


@dataclass(kw_only=True)
class StepRecord(Step):
    """A row of steps.parquet: a `Step` with its identity."""

    run_id: str
    method: str
    task: str
    sample_id: str
    turn: int
    step: int
    accept_flags: list[bool]  # per drafted position: did the target accept it (False after the first rejection)
    engine: str = "hf"  # "hf" (ours) | "vllm"; vLLM rows leave the timing and memory fields null


@dataclass
class TurnRecord:
    """A row of turns.parquet: one (method, sample, turn), decoded or skipped."""

    run_id: str
    method: str
    task: str
    sample_id: str
    turn: int
    replay: str  # "logged" | "free" | "mixed" | "raw" | "closed": where the replies in this turn's context came from
    context_len: int  # tokens before the model speaks (the rendered prompt of this turn)
    prompt_tokens: int  # = context_len; kept under the name other harnesses use
    prefill_tokens: int = 0
    new_tokens: int = 0
    num_steps: int = 0
    prefill_s: float | None = 0.0
    draft_prefill_s: float | None = 0.0
    decode_s: float = 0.0
    tau: float = float("nan")  # pooled over this turn's counted verify steps (metrics.tau_of); NaN when none
    ar_decode_s: float = 0.0  # the paired AR decode of the same turn
    ar_new_tokens: int = 0
    speedup_turn: float = float("nan")  # this turn alone: (ar_decode_s / ar_new_tokens) / (decode_s / new_tokens)
    stop_reason: str = ""  # eos | max_new_tokens | context_limit | skipped
    skip_reason: str = ""  # why the turn was not decoded, "" when it was
    dropped_tokens: int = 0  # tokens cut from the left under --context-policy truncate-left
    dropped_messages: int = 0  # whole oldest messages dropped under --context-policy truncate-left
    position: int = 0  # where this method ran in the turn's seed-shuffled order of methods (0 = first; ar included)
    output_ids: list[int] = field(default_factory=list)
    worker_host: str = ""  # the host that decoded this turn (every method of a turn runs on one worker)
    worker_device: str = ""  # its device: cpu, or cuda:N with N the physical GPU
    engine: str = "hf"  # "hf" (ours) | "vllm"
    last: bool = False  # the last turn of this (method, sample): the trajectory is finished for the method
    context_point: int = 0  # --context-points: the largest point this turn is the first to reach (0: not a point)
    cpu_others: float = float("nan")  # cores other processes kept busy on average during this decode (NaN: unknown)
    contended: bool = False  # cpu_others >= evalsuite.contention.CONTENDED_CORES: its timings are not an idle machine's
    repo: str = ""  # the sample's repository (SWE-bench: Trajectory.meta["repo"]), "" where the task has none
    # "" = paired with `ar`'s decode of the same context; "turn_index" = paired by turn index only (closed loop at
    # T>0: every method runs its own loop, so `ar`'s decode of this index saw another context)
    pairing: str = ""
    degenerate: bool = False  # the reply copies an earlier reply of the trajectory or loops (evalsuite.degenerate)
    degenerate_reason: str = ""  # its evidence, e.g. "copies 47 tokens of turn 0's reply"
    # decode_s of every timing repeat of this turn, in the order decoded (empty: one decode, or a run recorded
    # before the column existed: timing noise unmeasured); decode_s above is the median repeat's
    repeat_decode_s: list[float] = field(default_factory=list)


def step_records(key: TurnKey, result: TurnResult, engine: str) -> list[StepRecord]:
    return [StepRecord(**asdict(s), **asdict(key), step=i, engine=engine,
                       accept_flags=[j < s.num_accepted for j in range(s.num_drafted)])
            for i, s in enumerate(result.steps)]


def turn_record(key: TurnKey, result: TurnResult | None, **fields) -> TurnRecord:
    """The row of one turn, built once: its key, what the engine measured (`result`; None for a recorded skip, whose
    stop_reason is `skipped`) and the runner's `fields` (the context, where it ran, τ, the pairing with `ar`, ...)."""
    if result is None:
        return TurnRecord(**asdict(key), stop_reason=SKIPPED, **fields)
    return TurnRecord(**asdict(key), prefill_tokens=result.prefill_tokens, new_tokens=len(result.output_ids),
                      num_steps=len(result.steps), prefill_s=result.prefill_s, draft_prefill_s=result.draft_prefill_s,
                      decode_s=result.decode_s, stop_reason=result.stop_reason, output_ids=list(result.output_ids),
                      repeat_decode_s=[float(v) for v in result.repeat_decode_s], **fields)


def _schema(cls) -> pa.Schema:
    kinds = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_(),
             "int | None": pa.int64(), "float | None": pa.float64(),
             "list[bool]": pa.list_(pa.bool_()), "list[int]": pa.list_(pa.int64()),
             "list[float]": pa.list_(pa.float64())}
    return pa.schema([(f.name, kinds[f.type]) for f in fields(cls)])


STEP_SCHEMA = _schema(StepRecord)
TURN_SCHEMA = _schema(TurnRecord)
