"""Replays trajectories through an engine with each method, pairs every turn with `ar`, and stores the records.

Loop order: trajectory → turn → method. What each method's context is at each turn (replay mode, history, context
policy) comes from `evalsuite.replay`; how a turn is decoded, from the engine (`evalsuite.engines`). Every turn gets
one record per method, decoded or skipped with its reason. Each decode is kept as it came (`Decode`: the context
and the engine's `TurnResult`); once all methods have decoded a turn, each row is built once from it, paired with
`ar`'s decode (`Decode.row`), and the turn is persisted (`store.RunStore.write_turn`), so an interrupted run resumes
at the next turn. On `--resume`, each method's stored turns are replayed from their stored outputs
(`MethodReplay.replay_stored`) and only the missing (method, turn) decodes run; `ar` decodes again where another
method needs its pairing, without being rewritten. Each decoded turn is stored with its span labels
(`spans.label_turn`: kind and copy length per emitted token, from the context and output ids in memory).
"""

from __future__ import annotations

import hashlib
import random
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, NamedTuple

from evalsuite import contention, degenerate, metrics
from evalsuite.config import WEIGHT_LAYOUTS, RunConfig, environment
from evalsuite.conventions import BASELINE, CONTENDED_CORES, RUN_CONVENTIONS, SKIPPED
from evalsuite.engines import make_engine
from evalsuite.engines.base import Engine
from evalsuite.errors import UserError
from evalsuite.replay import ContextPolicy, MethodReplay, ReplaySetup, TurnContext, Window, make_policy, replay_type
from evalsuite.run import resume
from evalsuite.spans import SPANS_SCHEMA, SPANS_TABLE, label_turn, span_rows
from evalsuite.store.records import TurnKey, TurnRecord, TurnResult, step_records, turn_record
from evalsuite.store.run_store import RunStore, read_run
from evalsuite.tasks.base import LoadOptions, Trajectory, get_task, replay_source, select_samples

WARMUP_PROMPT = [{"role": "user", "content": "Warmup."}]


class Unit(NamedTuple):
    """A trajectory and the methods to decode on it (`Runner.pending_units`, `Runner.run_unit`)."""

    trajectory: Trajectory
    methods: tuple[str, ...]


@dataclass
class Progress:
    """What the CLI's live bar shows: `update` after every stored (method, turn), with its numbers; `step(tokens)`
    as decoding goes (every verify step, then the rest of the decode's --max-new-tokens × --repeats budget)."""

    total: int
    update: Callable[[dict], None] = lambda info: None
    step: Callable[[int], None] = lambda tokens: None


@dataclass(frozen=True)
class Decode:
    """One method's decode of one turn: its context, what the engine returned (`result`; None for a recorded skip)
    and what was known around it. Its row (`row`) is built once the turn is complete: when `ar`'s decode of it (the
    pairing) and whether the trajectory goes on are known."""

    key: TurnKey
    context: TurnContext
    position: int  # in the turn's seed-shuffled order of methods
    engine: str
    worker_host: str
    worker_device: str
    repo: str = ""
    result: TurnResult | None = None
    cpu_others: float | None = None  # cores other processes kept busy during the decode (None: unknown)
    degenerate: tuple[bool, str] = (False, "")  # degenerate.flag_reply against the method's earlier replies

    def row(self, baseline: Decode | None, last: bool) -> TurnRecord:
        """The turn's row: paired with `baseline` (`ar`'s decode of the turn) where both were decoded."""
        context, result = self.context, self.result
        ar = baseline.result if baseline is not None and result is not None else None
        steps = result.steps if result is not None else []
        return turn_record(
            self.key, result, replay=context.label, context_len=context.context_len,
            prompt_tokens=context.context_len, dropped_tokens=context.dropped_tokens,
            dropped_messages=context.dropped_messages, skip_reason=context.skip_reason, pairing=context.pairing,
            context_point=context.context_point, position=self.position, engine=self.engine,
            worker_host=self.worker_host, worker_device=self.worker_device, repo=self.repo, last=last,
            tau=metrics.tau_of([s.num_accepted for s in steps], [s.budget_limited for s in steps]),
            cpu_others=float("nan") if self.cpu_others is None else self.cpu_others,
            contended=self.cpu_others is not None and self.cpu_others >= CONTENDED_CORES,
            degenerate=self.degenerate[0], degenerate_reason=self.degenerate[1],
            **metrics.turn_pairing(None if ar is None else (ar.decode_s, len(ar.output_ids)),
                             result.decode_s if result is not None else 0.0,
                             len(result.output_ids) if result is not None else 0))


class Runner:
    def __init__(self, config: RunConfig, out_dir: Path, engine: Engine | None = None):
        config.validate()
        self.config = config
        self.store = RunStore(out_dir)
        self.task = get_task(config.task)
        self.engine = engine or make_engine(config, out_dir)
        self.methods = config.recorded_methods  # `ar` first: it runs for pairing, and is recorded whenever it runs
        self.replay_mode = config.replay if config.replay != "auto" else self.task.default_replay
        self.replay_type = replay_type(self.replay_mode)  # the mode's class: it builds each trajectory's replays
        self.run_id = Path(out_dir).name
        self.worker_host = socket.gethostname()  # recorded on every turn row; a Ray worker sets its own
        self.worker_device = ""  # the engine's device unless set (a Ray worker names its physical GPU)
        self.scaleout: dict = {"workers": 1, "ray_version": None, "shared_cpu": False}
        self.policy: ContextPolicy | None = None
        self.stored: dict[tuple[str, str], list] = {}  # (method, sample) → its stored turn rows, turn order

    # ---- set-up ---------------------------------------------------------------------------------------------
    def load(self, write_config: bool = True) -> None:
        """Data, the machine's load, then the engine (target and methods), then run.json (a Ray worker leaves that
        to the driver)."""
        self.store.prepare()
        # the data first: a malformed record or a bad --subset is reported before seconds of model loading
        self.trajectories = self.task.load(LoadOptions(self.config.limit, self.config.seed, self.config.data_path,
                                                       self.config.subset, self.config.format))
        if self.config.sample_ids is not None:
            self.trajectories = select_samples(self.trajectories, self.config.sample_ids, self.config.task)
        if not self.trajectories:
            raise UserError(f"task {self.config.task}: no samples to run")
        self.replay_type.check_data(self.config, self.trajectories)
        self.contention = contention.snapshot()  # before loading: what else keeps the CPU busy
        self.threads_requested = self.config.threads
        threads = contention.resolve_threads(self.config.threads, self.contention)
        stored = self.store.read_config() if self.config.resume else None
        if stored and self.config.threads in (None, "auto") and isinstance(stored.get("threads"), int):
            threads = stored["threads"]  # a resumed run keeps the thread count its first part was timed with
        self.threads_choice = stored.get("contention", {}).get("threads_choice") if stored else None
        # a resumed run keeps the weight layout (and so the product kernels) its first part resolved and was timed with
        layout = stored.get("weight_layout") if stored and self.config.weight_layout == "auto" else None
        # and the CPU attention's lane form for verify blocks
        lanes = ((stored or {}).get("attention_lanes_choice") or {}).get("chosen")
        self.engine.start(self.methods, threads, layout if layout in WEIGHT_LAYOUTS else None,
                          lanes if lanes in (8, 16) else None)
        if self.config.threads in (None, "auto") and not stored:  # the faster configuration, measured
            self.threads_choice = self.engine.tune_threads(list(range(1, threads + 1)))
            if self.threads_choice:
                threads = self.threads_choice["chosen"]
        self.config = replace(self.config, threads=threads)
        self.chat = self.engine.chat
        self.config = self.replay_type.configure(self.config, self.chat.chat_template)
        self.worker_device = self.worker_device or self.engine.device_label
        self.policy = make_policy(self.config.context_policy,
                                  Window(self.chat.max_context, self.config.max_new_tokens, self.config.k))
        self._check_records()
        if write_config:
            write_run_config(self.store, self.config, self.describe())
        self.refresh_stored()

    def refresh_stored(self) -> None:
        """Read what the store holds (another worker may have written since)."""
        tables = read_run(self.store.root)
        self.stored = {key: list(rows.itertuples(index=False)) for key, rows in tables.done_turns().items()}

    def describe(self) -> dict:
        engine = self.engine.describe()
        device = engine.pop("device_facts", {})
        return {
            **self.config.as_dict(),
            "run_id": self.run_id,
            "engine": self.engine.name,
            "replay": self.replay_mode,
            "replay_source": replay_source(self.trajectories, self.replay_mode),
            **engine,
            **self.replay_type.describe(self.config, self.chat.chat_template),
            "task_licence": self.task.licence,
            "task_source": self.task.source,
            "sample_ids": [t.sample_id for t in self.trajectories],
            "data_sha256": resume.data_hash(self.config.data_path),
            "conventions": RUN_CONVENTIONS,
            "environment": {**environment(), **device},
            "contention": {**self.contention.describe(), "threads_requested": self.threads_requested,
                           "threads_choice": self.threads_choice},
            "scaleout": {**self.scaleout, "worker_info": self.scaleout.get("worker_info") or [
                {"host": self.worker_host, "device": self.worker_device}]},
        }

    def _check_records(self) -> None:
        chat = self.chat
        for trajectory in self.trajectories:
            for turn in trajectory.turns:
                if turn.prompt_ids is not None and any(not 0 <= i < chat.vocab_size for i in turn.prompt_ids):
                    raise UserError(f"sample {trajectory.sample_id}: prompt_ids hold ids outside the target's "
                                    f"vocabulary (0..{chat.vocab_size - 1})")
        if not chat.chat_template and any(t.prompt_ids is None for tr in self.trajectories for t in tr.turns):
            raise UserError(f"target {chat.name} has no chat template, so it cannot render the chat records of task "
                            f"{self.config.task}; use a chat model, or --task custom with prompt_ids records")

    # ---- what is left to do -----------------------------------------------------------------------------------
    def is_finished(self, method: str, sample_id: str) -> bool:
        rows = self.stored.get((method, sample_id))
        return bool(rows) and bool(rows[-1].last)

    def pending_methods(self, trajectory: Trajectory) -> tuple[str, ...]:
        """The methods whose trajectory is unfinished, plus `ar` whenever another of them needs its pairing (then
        `ar` is decoded again where it is stored, but not rewritten). Empty when all are finished."""
        todo = metrics.with_baseline(m for m in self.methods if not self.is_finished(m, trajectory.sample_id))
        return tuple(m for m in self.methods if m in todo)

    def pending_units(self) -> list[Unit]:
        return [Unit(t, methods) for t in self.trajectories if (methods := self.pending_methods(t))]

    # ---- the run ---------------------------------------------------------------------------------------------
    def warm_up(self) -> dict[str, float]:
        """The engine's untimed warm-up; each method's seconds per token in it (for the plan)."""
        self.warmed = True
        return self.engine.warm_up(self._warmup_ids()) if self.config.warmup else {}

    def run(self, progress: Progress | None = None) -> None:
        units = self.pending_units()
        if units:
            if not getattr(self, "warmed", False):
                self.warm_up()
            for unit in units:
                self.run_unit(unit.trajectory, progress, unit.methods)
        self.refresh_stored()
        if not self.pending_units():
            self.store.compact()  # a finished run is a handful of files

    def run_unit(self, trajectory: Trajectory, progress: Progress | None = None,
                 methods: tuple[str, ...] | None = None) -> None:
        """One trajectory with its pending methods: every turn decoded where a (method, turn) is not stored yet,
        paired with `ar`, and persisted turn by turn."""
        methods = self.pending_methods(trajectory) if methods is None else methods
        if not methods:
            return
        progress = progress or Progress(total=0)
        sample = trajectory.sample_id
        replays = self.replays(trajectory, methods)
        stored = {name: {row.turn: row for row in self.stored.get((name, sample), [])} for name in methods}
        earlier = {name: [] for name in methods}  # (turn, output ids) per method so far: the degenerate check
        self.engine.begin_trajectory()
        turn = 0
        while any(replay.has_turn(turn) for replay in replays.values()):
            wanted = [m for m in methods if replays[m].has_turn(turn) and turn not in stored[m]]
            ar_has_turn = BASELINE in replays and replays[BASELINE].has_turn(turn)  # its own loop may end first
            decode = set(metrics.with_baseline(wanted) if ar_has_turn else wanted)
            decodes: dict[str, Decode] = {}
            for position, name in enumerate(m for m in self.turn_order(sample, turn) if m in decode):
                done = decodes[name] = self._decode(trajectory, turn, name, replays[name].context(turn), position,
                                                    earlier[name], progress)
                reply = None if done.result is None else list(done.result.output_ids)
                replays[name].record_reply(turn, None if reply is None else self.chat.decode(reply))
                if reply is not None:
                    earlier[name].append((turn, reply))
            for name in methods:
                if name not in decode and replays[name].has_turn(turn):  # stored: continue from the stored reply
                    row = stored[name].get(turn)
                    replays[name].replay_stored(turn, self._stored_text(row))
                    if row is not None and row.output_ids is not None:
                        earlier[name].append((turn, list(row.output_ids)))
            baseline = decodes.get(BASELINE)
            self._store_turn(sample, turn, [decodes[m] for m in wanted], baseline, replays, progress)
            turn += 1

    def _decode(self, trajectory: Trajectory, turn: int, name: str, context: TurnContext, position: int,
                earlier: list[tuple[int, list[int]]], progress: Progress) -> Decode:
        """One method's decode of one turn, metered for contention, or a recorded skip."""
        result, others, flag = None, None, (False, "")
        if not context.skipped:
            budget, stepped = self.config.max_new_tokens * self.config.repeats, [0]

            def on_step(tokens: int) -> None:
                stepped[0] += tokens
                progress.step(tokens)

            meter = contention.DecodeMeter()
            meter.start()
            result = self.engine.decode(name, context.ids, turn_seed(self.config.seed, trajectory.sample_id, turn),
                                        on_step)
            others = meter.stop()
            progress.step(max(budget - stepped[0], 0))  # the rest of this decode's budget
            flag = degenerate.flag_reply(result.output_ids, earlier)
        return Decode(TurnKey(self.run_id, name, self.config.task, trajectory.sample_id, turn), context, position,
                      self.engine.name, self.worker_host, self.worker_device, str(trajectory.meta.get("repo") or ""),
                      result, others, flag)

    def _store_turn(self, sample: str, turn: int, decodes: list[Decode], baseline: Decode | None, replays,
                    progress: Progress) -> None:
        """Build the turn's rows (each method's decode paired with `ar`'s; `last` once its replay says the trajectory
        ends), persist them with their steps, spans and any replay's own table, then report progress."""
        if not decodes:
            return
        kept = [d.row(baseline, last=not replays[d.key.method].has_turn(turn + 1)) for d in decodes]
        steps = {d.key.method: step_records(d.key, d.result, d.engine) for d in decodes if d.result is not None}
        extra = self._extra_rows(replays, kept)
        spans = self._span_rows(sample, turn, {d.key.method: (d.context.ids, d.result.output_ids)
                                               for d in decodes if d.result is not None})
        if spans:
            extra[SPANS_TABLE] = (spans, SPANS_SCHEMA)
        self.store.write_turn(sample, turn, [s for d in decodes for s in steps.get(d.key.method, [])], kept, extra)
        for record in (r for r in kept if r.stop_reason != SKIPPED):
            mine = steps[record.method]
            progress.update({"method": record.method, "sample": sample, "turn": turn, "tau": record.tau,
                             "tau_sums": metrics.tau_sums([s.num_accepted for s in mine],
                                                          [s.budget_limited for s in mine]),
                             "tokens_per_s": record.new_tokens / max(record.decode_s, 1e-9),
                             "speedup": record.speedup_turn})

    def turn_order(self, sample_id: str, turn_index: int) -> list[str]:
        """The order the methods (`ar` included) decode a turn in: shuffled per turn from the run's seed, so that
        no method always runs first (or right after another's prefill); recorded as each turn's `position`."""
        order = list(self.methods)
        random.Random(f"{self.config.seed}:{sample_id}:{turn_index}").shuffle(order)
        return order

    # ---- pieces ----------------------------------------------------------------------------------------------
    def replays(self, trajectory: Trajectory, methods: tuple[str, ...]) -> dict[str, MethodReplay]:
        """Each method's replay of `trajectory` as this run makes it (its replay mode, context policy and points)."""
        setup = ReplaySetup(self.policy, self._render, self.config.max_turns, self.config.context_points,
                            self.config.task, self.config.temperature, self.config.tool_format)
        return self.replay_type.for_trajectory(trajectory, methods, setup)

    @staticmethod
    def _extra_rows(replays: dict[str, MethodReplay], kept: list[TurnRecord]) -> dict:
        """Other tables' rows of one turn (`MethodReplay.turn_extra`), keyed like the turn's rows."""
        extra: dict[str, tuple[list[dict], object]] = {}
        for record in kept:
            key = {k: getattr(record, k) for k in ("run_id", "method", "task", "sample_id", "turn")}
            for table, (row, schema) in replays[record.method].turn_extra(record.turn).items():
                extra.setdefault(table, ([], schema))[0].append({**key, **row})
        return extra

    def _render(self, trajectory: Trajectory):
        return lambda messages: self.chat.render(messages, trajectory.tools, self.config.enable_thinking)

    def _span_rows(self, sample: str, turn: int, decoded: dict[str, tuple[list[int], list[int]]]) -> list[dict]:
        """Span labels of the methods' decoded turns (after all of them decoded, outside any timing); methods that
        saw the same context and wrote the same reply (T=0) are labelled once."""
        labels, records = {}, []
        for name, (context_ids, output_ids) in decoded.items():
            key = (tuple(context_ids), tuple(output_ids))
            if key not in labels:
                labels[key] = label_turn(output_ids, context_ids, self.chat.tokenizer, task=self.config.task,
                                         method=name, sample_id=sample, turn=turn, run_id=self.run_id)
            records.append(replace(labels[key], method=name))
        return span_rows(records)

    def _stored_text(self, row) -> str | None:
        if row is None or row.output_ids is None:
            return None
        return self.chat.decode(list(row.output_ids))

    def _warmup_ids(self) -> list[int]:
        """A short chat prompt, or the first record's own ids when every record is raw ids (a base model without a
        chat template must warm up too)."""
        turns = [turn for trajectory in self.trajectories for turn in trajectory.turns]
        if turns and all(turn.prompt_ids is not None for turn in turns):
            return list(turns[0].prompt_ids[:32])
        return self.chat.render(WARMUP_PROMPT, None)


def turn_seed(seed: int, sample_id: str, turn: int) -> int:
    """The sampling seed of one turn, the same for every method (so at T>0 they draw from the same stream) and
    independent of what ran before (so a resumed turn samples as an uninterrupted one)."""
    return int(hashlib.sha256(f"{seed}:{sample_id}:{turn}".encode()).hexdigest()[:8], 16)


def write_run_config(store: RunStore, config: RunConfig, current: dict) -> None:
    """Write run.json; over stored results only with --resume and an unchanged drift-relevant configuration."""
    previous = store.read_config()
    if previous is not None and not read_run(store.root).turns.empty:
        if not config.resume:
            raise UserError(f"--out {store.root} already holds results; pass --resume or choose a new --out")
        drift = resume.differences(previous, current)
        if drift:
            raise UserError(f"--resume: {drift[0]}; use a new --out")
        current = resume.resumed_config(previous, current)
    store.clean()  # before any decoding: what a killed writer left behind
    store.write_config(current)
