"""Replays trajectories through the target with each method, pairs every turn with its AR baseline, and stores records.

Loop order: trajectory → turn → method. What each method's context is at each turn (replay mode, history,
context policy) comes from `evalsuite.replay`; every turn up to --max-turns gets a record per method, decoded
or skipped with its reason. After all methods have decoded a turn, each is paired with `ar`. One target KV
cache serves them all: before a turn, the cache is cropped to the longest common prefix with the new context
and only the rest is prefilled (so methods that see the same context share the prefill, and a growing agent
context is prefilled incrementally).
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from jinja2 import TemplateError

from evalsuite.chat_format import fit_to_template
from evalsuite import resume
from evalsuite.config import RunConfig, environment
from evalsuite.engine import TurnResult, decode_turn
from evalsuite.errors import UserError
from evalsuite.methods.base import Drafter, Sampling, common_prefix_len, get_method
from evalsuite.records import RunStore, StepRecord, TurnRecord
from evalsuite.replay import ContextPolicy, MethodReplay, TurnContext, Window, check_replay_mode, make_policy
from evalsuite.target import TargetModel, cached_weights_hash, text_hash
from evalsuite.timing import DeviceClock
from evalsuite.tasks.base import LoadOptions, Trajectory, get_task, select_samples

BASELINE = "ar"
WARMUP_PROMPT = [{"role": "user", "content": "Warmup."}]


@dataclass
class PrefixCache:
    """The target KV cache plus the token ids it holds and their features for the drafters' layers."""

    target: TargetModel
    layer_ids: tuple[int, ...]
    cache: object = None
    ids: list[int] = field(default_factory=list)
    features: torch.Tensor | None = None  # [n, len(layer_ids), H]
    last_logits: torch.Tensor | None = None  # logits at the last cached position

    def __post_init__(self):
        self.cache = self.target.new_cache()

    def prefill(self, ids: list[int]) -> int:
        """Bring the cache to exactly `ids`; returns how many tokens were run through the target."""
        common = common_prefix_len(torch.tensor(self.ids, dtype=torch.long), torch.tensor(ids, dtype=torch.long))
        if common == len(ids) and common == len(self.ids) and self.last_logits is not None:
            return 0
        common = min(common, len(ids) - 1)  # the last token always runs, to produce fresh logits
        self.target.crop(self.cache, common)
        self.ids = self.ids[:common]
        if self.features is not None:
            self.features = self.features[:common]
        fresh = torch.tensor(ids[common:], dtype=torch.long, device=self.target.device)
        out = self.target.forward(fresh, self.cache, self.layer_ids, last_only=True)
        self.ids = list(ids)
        self.last_logits = out.logits
        if out.hidden is not None:
            self.features = out.hidden if self.features is None else torch.cat([self.features, out.hidden])
        return fresh.numel()

    def rewind(self) -> None:
        """Drop whatever a decode appended beyond the cached context."""
        self.target.crop(self.cache, len(self.ids))

    def features_for(self, layers: tuple[int, ...]) -> torch.Tensor | None:
        if not layers or self.features is None:
            return None
        index = [self.layer_ids.index(j) for j in layers]
        return self.features[:, index]


class Unit(NamedTuple):
    """A trajectory and the methods to decode on it (`Runner.pending_units`, `Runner.run_unit`)."""

    trajectory: Trajectory
    methods: tuple[str, ...]


@dataclass
class Progress:
    """What the CLI's live bar shows; the runner calls `update` after every decoded turn."""

    total: int
    update: Callable[[dict], None] = lambda info: None


class Runner:
    engine_name = "hf"  # the `engine` column of every record; engines/vllm_engine.py sets "vllm"

    def __init__(self, config: RunConfig, out_dir: Path):
        config.validate()
        self.config = config
        self.store = RunStore(out_dir)
        self.task = get_task(config.task)
        self.sampling = Sampling(config.temperature, config.top_p, config.top_k)
        methods = [BASELINE] + [m for m in config.methods if m != BASELINE]
        self.method_infos = [get_method(m) for m in methods]  # unknown names fail before any loading
        self.record_baseline = BASELINE in config.methods
        self.replay = config.replay if config.replay != "auto" else self.task.default_replay
        self.target: TargetModel | None = None
        self.policy: ContextPolicy | None = None
        self.drafters: dict[str, Drafter] = {}
        self.run_id = out_dir.name
        self.worker_host = socket.gethostname()  # recorded on every turn row; a Ray worker sets its own
        self.worker_device = ""  # the target's device unless set (a Ray worker names its physical GPU)
        self.scaleout: dict = {"workers": 1, "ray_version": None, "shared_cpu": False}

    # ---- set-up ---------------------------------------------------------------------------------------------
    def load(self, write_config: bool = True) -> None:
        """Target, drafters and data; then run.json (a Ray worker leaves that to the driver)."""
        self.store.prepare()
        # the data first: a malformed record or a bad --subset is reported before seconds of model loading
        self.trajectories = self.task.load(LoadOptions(self.config.limit, self.config.seed, self.config.data_path,
                                                       self.config.subset))
        if self.config.sample_ids is not None:
            self.trajectories = select_samples(self.trajectories, self.config.sample_ids, self.config.task)
        if not self.trajectories:
            raise UserError(f"task {self.config.task}: no samples to run")
        check_replay_mode(self.config.replay, self.trajectories, self.config.task)
        if self.config.threads is not None:
            torch.set_num_threads(self.config.threads)
        self.target = self._load_target()
        self.worker_device = self.worker_device or str(self.target.device)
        self._clock = DeviceClock(self.target.device)
        self.policy = make_policy(self.config.context_policy,
                                  Window(self.target.max_context, self.config.max_new_tokens, self.config.k))
        for trajectory in self.trajectories:
            self._check_prompt_ids(trajectory)
        self._check_chat_template()
        self._load_drafters()
        if write_config:
            self._write_config()

    def _load_target(self) -> TargetModel:
        return TargetModel.load(self.config.target, self.config.device, self.config.dtype, self.config.weight_layout,
                                self.config.kv_cache, self.config.compile)

    def _load_drafters(self) -> None:
        """One drafter per method; other engines (engines/) start theirs instead."""
        for info in self.method_infos:
            options = dict(self.config.method_options.get(info.name, {}))
            if info.name in self.config.drafters:
                options["drafter"] = self.config.drafters[info.name]
            drafter = info.factory(self.target, options)
            self.target.check_layer_ids(drafter.feature_layers, f"method {info.name}")
            if self.config.repeats > 1 and type(drafter).reset is not Drafter.reset:
                raise UserError(f"--repeats {self.config.repeats}: method {info.name} learns from every reply it "
                                "sees, so a repeated turn would not repeat the same work; use --repeats 1")
            self.drafters[info.name] = drafter

    def describe(self) -> dict:
        target = self.target
        drafter_info = {name: d.describe() for name, d in self.drafters.items()}
        return {
            **self.config.as_dict(),
            "run_id": self.run_id,
            "engine": self.engine_name,
            "replay": self.replay,
            "dtype": str(target.dtype).removeprefix("torch."),
            "weight_layout": target.weight_layout,
            "target_name": target.name,
            "target_path": target.model_dir,
            "target_sha256": cached_weights_hash(target.model_dir),
            "target_max_context": target.max_context,
            "chat_template_sha256": text_hash(target.chat_template),
            "tokenizer_sha256": text_hash(json.dumps(target.tokenizer.get_vocab(), sort_keys=True)),
            "drafters": drafter_info,
            "drafter_sha256": {n: d.get("checkpoint_sha256") for n, d in drafter_info.items()},
            "task_licence": self.task.licence,
            "task_source": self.task.source,
            "sample_ids": [t.sample_id for t in self.trajectories],
            "data_sha256": resume.data_hash(self.config.data_path),
            "threads": torch.get_num_threads(),
            "conventions": {
                "tau": "pooled ratio over verify steps: sum of (accepted drafts + 1) / number of steps, bonus "
                       "included; steps the token budget left no room to draft (budget_limited) are excluded; "
                       "drafts accepted after an EOS are not counted",
                "speedup": "paired with AR on the same turns and pooled: (sum AR decode s / sum AR tokens) / "
                           "(sum method decode s / sum method tokens) over the turns both decoded; decode excludes "
                           "the target prefill and includes the drafter's start-of-turn work; turns.parquet's "
                           "speedup_turn is the same ratio for one turn",
                "context_len": "target KV length when the step starts",
            },
            "environment": environment(target.device),
            "scaleout": {**self.scaleout, "worker_info": self.scaleout.get("worker_info") or [
                {"host": self.worker_host, "device": self.worker_device, "threads": torch.get_num_threads()}]},
        }

    def _write_config(self) -> None:
        write_run_config(self.store, self.config, self.describe())

    # ---- the run ---------------------------------------------------------------------------------------------
    def pending_methods(self, trajectory: Trajectory) -> tuple[str, ...]:
        """The methods to decode on this trajectory: its unfinished recorded (method, sample) pairs, plus the `ar`
        baseline whenever another of them needs its pairing (then `ar` is decoded again even if its own pair is
        finished, but not rewritten). Empty when every pair is finished."""
        todo = {m for m in self.drafters if self.is_recorded(m) and not self.store.is_finished(m, trajectory.sample_id)}
        if todo - {BASELINE}:
            todo.add(BASELINE)
        return tuple(m for m in self.drafters if m in todo)

    def pending_units(self) -> list[Unit]:
        """One unit per trajectory with unfinished (method, sample) pairs."""
        return [Unit(t, methods) for t in self.trajectories if (methods := self.pending_methods(t))]

    def pending(self) -> list[Trajectory]:
        """Trajectories with at least one unfinished (method, sample) pair."""
        return [unit.trajectory for unit in self.pending_units()]

    def is_recorded(self, method: str) -> bool:
        return method != BASELINE or self.record_baseline

    def warm_up(self) -> None:
        """Untimed first calls, so that no recorded turn pays them: one short decode per method, then a target
        forward of every verify block size the run can use (1 … k+1) for each set of feature layers read."""
        if not self.config.warmup:
            return
        ids = self._warmup_ids()
        for drafter in self.drafters.values():
            prefix = PrefixCache(self.target, drafter.feature_layers)
            prefix.prefill(ids)
            self._decode(drafter, prefix, ids, max_new_tokens=16, generator=torch.Generator().manual_seed(0))
            drafter.reset()  # the warm-up reply is not part of the run
        for layers in sorted({d.feature_layers for d in self.drafters.values()}):
            prefix = PrefixCache(self.target, layers)
            prefix.prefill(ids)
            for size in range(1, self.config.k + 2):
                block = torch.tensor(ids[:size] + ids[:1] * max(size - len(ids), 0), dtype=torch.long,
                                     device=self.target.device)
                self.target.forward(block, prefix.cache, layers)
                prefix.rewind()

    def run(self, progress: Progress | None = None) -> None:
        progress = progress or Progress(total=0)
        units = self.pending_units()
        if not units:
            return
        self.warm_up()
        for unit in units:
            self.run_unit(unit.trajectory, progress, unit.methods)

    def run_unit(self, trajectory: Trajectory, progress: Progress | None = None,
                 methods: tuple[str, ...] | None = None) -> None:
        """One unit of work: a trajectory with its pending methods (`pending_methods` unless given; AR paired),
        decoded; the unfinished recorded pairs are written to the store (finished ones never are)."""
        methods = self.pending_methods(trajectory) if methods is None else methods
        if not methods:
            return
        layer_union = tuple(sorted({j for d in self.drafters.values() for j in d.feature_layers}))
        steps, turns = self.run_trajectory(trajectory, layer_union, progress or Progress(total=0), methods)
        for name in methods:
            if self.is_recorded(name) and not self.store.is_finished(name, trajectory.sample_id):
                self.store.write_trajectory(name, trajectory.sample_id, steps[name], turns[name])

    def run_trajectory(self, trajectory: Trajectory, layer_union: tuple[int, ...], progress: Progress,
                       methods: tuple[str, ...] | None = None):
        """Every turn up to --max-turns gets one record per method: decoded, or skipped with its reason."""
        cfg = self.config
        drafters = {name: self.drafters[name] for name in (methods or self.drafters)}
        prefix = PrefixCache(self.target, layer_union)
        render = lambda messages: self._render(messages, trajectory.tools)  # noqa: E731
        replays = {name: MethodReplay(trajectory, self.replay, self.policy, render) for name in drafters}
        steps = {name: [] for name in drafters}
        turns = {name: [] for name in drafters}
        seed = int(hashlib.sha256(f"{cfg.seed}:{trajectory.sample_id}".encode()).hexdigest()[:8], 16)
        generators = {name: torch.Generator().manual_seed(seed) for name in drafters}
        for turn_index in range(len(trajectory.turns[: cfg.max_turns])):
            order = [n for n in self.turn_order(trajectory.sample_id, turn_index) if n in drafters]
            records: dict[str, TurnRecord] = {}
            for position, name in enumerate(order):
                drafter = drafters[name]
                context = replays[name].context(turn_index)
                record = self._turn_record(name, trajectory, turn_index, context)
                record.position = position
                records[name] = record
                if context.skipped:
                    record.stop_reason, record.skip_reason = "skipped", context.skip_reason
                    replays[name].record_reply(turn_index, None)
                    continue
                result = self._decode_turn(drafter, prefix, context.ids, record, generators[name])
                self._fill(record, result)
                steps[name].extend(self._step_records(name, trajectory, turn_index, result))
                replays[name].record_reply(turn_index, self.target.decode(result.output_ids))
            baseline = records[BASELINE]
            for name in drafters:
                record = records[name]
                if record.stop_reason != "skipped" and baseline.stop_reason != "skipped":
                    record.ar_decode_s, record.ar_new_tokens = baseline.decode_s, baseline.new_tokens
                    record.speedup_turn = _speedup(baseline, record)
                turns[name].append(record)
                progress.update({"method": name, "sample": trajectory.sample_id, "turn": turn_index,
                                 "tau": record.tau, "tokens_per_s": record.new_tokens / max(record.decode_s, 1e-9),
                                 "speedup": record.speedup_turn})
        return steps, turns

    def turn_order(self, sample_id: str, turn_index: int) -> list[str]:
        """The order the methods (`ar` included) decode a turn in: shuffled per turn from the run's seed, so that
        no method always runs first (or right after another's prefill); recorded as each turn's `position`."""
        order = list(self.drafters)
        random.Random(f"{self.config.seed}:{sample_id}:{turn_index}").shuffle(order)
        return order

    def _decode_repeats(self, what: str, drafter: Drafter, prefix: PrefixCache, ids: list[int],
                        generator: torch.Generator) -> TurnResult:
        """Decode the turn --repeats times, each from the same generator state (so at any temperature every repeat
        makes the same choices), and keep the median repeat."""
        state = generator.get_state()
        results = []
        for _ in range(self.config.repeats):
            generator.set_state(state)
            results.append(self._decode(drafter, prefix, ids, self.config.max_new_tokens, generator))
            prefix.rewind()
        return median_repeat(results, what)

    # ---- pieces ----------------------------------------------------------------------------------------------
    def _render(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """Through the target's own template; tools and tool messages fall back to text where it has no support."""
        messages, tools = fit_to_template(messages, tools, self.target.chat_template or "")
        try:
            return self.target.render(messages, tools, self.config.enable_thinking)
        except TemplateError as err:
            raise UserError(f"target {self.target.name}: its chat template cannot render this conversation "
                            f"({err}); try --task custom with prompt_ids") from err

    def _check_prompt_ids(self, trajectory: Trajectory) -> None:
        for turn in trajectory.turns:
            if turn.prompt_ids is not None and any(not 0 <= i < self.target.vocab_size for i in turn.prompt_ids):
                raise UserError(f"sample {trajectory.sample_id}: prompt_ids hold ids outside the target's vocabulary "
                                f"(0..{self.target.vocab_size - 1})")

    def _check_chat_template(self) -> None:
        if not self.target.chat_template and any(t.prompt_ids is None for tr in self.trajectories for t in tr.turns):
            raise UserError(f"target {self.target.name} has no chat template, so it cannot render the chat records "
                            f"of task {self.config.task}; use a chat model, or --task custom with prompt_ids records")

    def _warmup_ids(self) -> list[int]:
        """A short chat prompt, or the first record's own ids when every record is raw ids (a base model without a
        chat template must warm up too)."""
        turns = [turn for trajectory in self.trajectories for turn in trajectory.turns]
        if turns and all(turn.prompt_ids is not None for turn in turns):
            return list(turns[0].prompt_ids[:32])
        return self._render(WARMUP_PROMPT, None)

    def _decode_turn(self, drafter: Drafter, prefix: PrefixCache, ids: list[int], record: TurnRecord,
                     generator: torch.Generator) -> TurnResult:
        """Prefill (timed apart) and decode one turn --repeats times (the median kept); other engines (engines/)
        replace this."""
        start = self._clock.mark()
        record.prefill_tokens = prefix.prefill(ids)
        record.prefill_s = self._clock.seconds(start, self._clock.mark())
        return self._decode_repeats(f"method {record.method}, sample {record.sample_id}, turn {record.turn}",
                                    drafter, prefix, ids, generator)

    def _decode(self, drafter: Drafter, prefix: PrefixCache, ids: list[int], max_new_tokens: int,
                generator: torch.Generator) -> TurnResult:
        context = torch.tensor(ids, dtype=torch.long, device=self.target.device)
        return decode_turn(self.target, drafter, prefix.cache, context, prefix.features_for(drafter.feature_layers),
                           prefix.last_logits, self.config.k, self.sampling, max_new_tokens, generator, self._clock)

    def _turn_record(self, name, trajectory, turn_index, context: TurnContext) -> TurnRecord:
        return TurnRecord(
            run_id=self.run_id, method=name, task=self.config.task, sample_id=trajectory.sample_id, turn=turn_index,
            replay=context.replay, context_len=context.context_len, prompt_tokens=context.context_len,
            prefill_tokens=0, new_tokens=0, num_steps=0, prefill_s=0.0, draft_prefill_s=0.0, decode_s=0.0,
            tau=float("nan"), ar_decode_s=0.0, ar_new_tokens=0, speedup_turn=float("nan"), stop_reason="",
            skip_reason="", dropped_tokens=context.dropped_tokens, dropped_messages=context.dropped_messages,
            worker_host=self.worker_host, worker_device=self.worker_device,
            engine=self.engine_name,
        )

    @staticmethod
    def _fill(record: TurnRecord, result: TurnResult) -> None:
        record.output_ids = list(result.output_ids)
        record.new_tokens = len(result.output_ids)
        record.num_steps = len(result.steps)
        record.draft_prefill_s = result.draft_prefill_s
        record.decode_s = result.decode_s
        record.stop_reason = result.stop_reason
        counted = [s for s in result.steps if not s.budget_limited]
        if counted:
            record.tau = sum(s.num_accepted + 1 for s in counted) / len(counted)

    def _step_records(self, name, trajectory, turn_index, result: TurnResult) -> list[StepRecord]:
        return [
            StepRecord(run_id=self.run_id, method=name, task=self.config.task, sample_id=trajectory.sample_id,
                       turn=turn_index, step=i, context_len=s.context_len, num_drafted=s.num_drafted,
                       num_accepted=s.num_accepted,
                       accept_flags=[j < s.num_accepted for j in range(s.num_drafted)], emitted=s.emitted,
                       draft_s=s.draft_s, verify_s=s.verify_s, step_s=s.step_s,
                       draft_state_bytes=s.draft_state_bytes, draft_history_bytes=s.draft_history_bytes,
                       engine=self.engine_name, budget_limited=s.budget_limited)
            for i, s in enumerate(result.steps)
        ]


def write_run_config(store: RunStore, config: RunConfig, current: dict) -> None:
    """Write run.json; over finished results only with --resume and an unchanged drift-relevant configuration."""
    previous = store.read_config()
    if previous is not None and store.finished_pairs():
        if not config.resume:
            raise UserError(f"--out {store.root} already holds results; pass --resume or choose a new --out")
        drift = resume.differences(previous, current)
        if drift:
            raise UserError(f"--resume: {drift[0]}; use a new --out")
        current = resume.resumed_config(previous, current)
    store.clean()  # before any decoding: what a killed writer left behind
    store.write_config(current)


def median_repeat(results: list[TurnResult], what: str) -> TurnResult:
    """The repeat whose decode loop took the median time (the lower middle one for an even count), with its steps.

    The drafter's start-of-turn work is taken from the first repeat: later repeats find a prefix-reusing drafter's
    cache already holding the context, so only the first pays what a real turn pays. Every repeat must have done
    the same work (same output, same drafts accepted); anything else is an error, not a silently mixed record.
    """
    first = results[0]
    work = [(s.num_drafted, s.num_accepted) for s in first.steps]
    for other in results[1:]:
        if other.output_ids != first.output_ids or [(s.num_drafted, s.num_accepted) for s in other.steps] != work:
            raise UserError(f"--repeats {len(results)}: {what}: a repeat decoded differently from the first "
                            "(nondeterministic kernels, or a drafter that learns from its own replies); "
                            "use --repeats 1")
    loop = sorted(results, key=lambda r: r.decode_s - r.draft_prefill_s)[(len(results) - 1) // 2]
    loop.decode_s = loop.decode_s - loop.draft_prefill_s + first.draft_prefill_s
    loop.draft_prefill_s = first.draft_prefill_s
    return loop


def _speedup(baseline: TurnRecord, record: TurnRecord) -> float:
    if not (baseline.new_tokens and record.new_tokens and record.decode_s > 0 and baseline.decode_s > 0):
        return float("nan")
    return (baseline.decode_s / baseline.new_tokens) / (record.decode_s / record.new_tokens)
