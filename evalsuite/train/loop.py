"""The training loop every recipe runs: stages of AdamW steps with warmup + cosine decay, a rich progress bar,
periodic checkpoints of the full training state, validation on held-out training sequences, and resume.

Determinism and resume: the anchors of step s are drawn from `numpy.random.default_rng((seed, stage, s))`, so a
resumed run sees exactly the batches an uninterrupted run would have seen; the training state (module weights,
optimizer moments, stage and step, loss history) is written atomically to `<out>/train_state.pt` every
`checkpoint_every` steps and at the end of each stage.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from evalsuite.errors import UserError
from evalsuite.train.features import FeatureCache

STATE_FILE = "train_state.pt"


@dataclass(frozen=True)
class LoopOptions:
    seed: int = 0
    val_fraction: float = 0.03  # training sequences held back to measure the drafter (never trained on)
    checkpoint_every: int = 50
    val_every: int = 100
    val_anchors: int = 256
    warmup_fraction: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    threads: int | None = None


@dataclass
class Stage:
    """One optimisation stage: `loss(batch, fraction_done)` → dict with 'loss' (and logged components)."""

    name: str
    steps: int
    lr: float
    params: Callable[[], list[nn.Parameter]]
    loss: Callable[["Batch", float], dict[str, torch.Tensor]]
    batch_seqs: int
    anchors_per_seq: int
    on_start: Callable[[], None] = lambda: None


@dataclass
class Batch:
    """Anchors sampled from a few sequences: anchors[i] are token positions inside sequence seqs[i]."""

    seqs: list[int]
    anchors: list[np.ndarray]


@dataclass
class History:
    stage: int = 0
    step: int = 0  # steps finished in `stage`
    log: list[dict] = field(default_factory=list)  # one row per logged step
    val: list[dict] = field(default_factory=list)
    seconds: float = 0.0  # wall time, including any time the job was paused (SIGSTOP) or shared the CPU
    # CPU time of the training process over all its threads (a paused job accrues none); 0 where a state saved
    # before this was recorded is resumed, and `cpu_from_step` then says from which step on it counts
    cpu_seconds: float = 0.0
    cpu_from_step: int = 0


def split_sequences(cache: FeatureCache, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Seeded train/validation split of the sequences that have at least two reply tokens."""
    usable = [i for i in range(len(cache)) if cache.span(i)[2] - cache.span(i)[1] >= 2]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(usable))
    n_val = max(1, int(round(fraction * len(usable)))) if fraction > 0 and len(usable) > 1 else 0
    val = sorted(usable[i] for i in order[:n_val])
    train = sorted(usable[i] for i in order[n_val:])
    return train, val


def anchor_range(cache: FeatureCache, seq: int) -> tuple[int, int]:
    """Anchors are reply tokens (the first reply token is the first anchor at decode time) with at least one
    token after them: [prompt_end, end-1) in flat offsets relative to the sequence start."""
    start, prompt_end, end = cache.span(seq)
    return max(prompt_end - start, 1), end - start - 1


def sample_batch(cache: FeatureCache, pool: list[int], rng: np.random.Generator, batch_seqs: int,
                 anchors_per_seq: int) -> Batch:
    seqs = [int(s) for s in rng.choice(pool, size=min(batch_seqs, len(pool)), replace=False)]
    anchors = []
    for seq in seqs:
        lo, hi = anchor_range(cache, seq)
        count = min(anchors_per_seq, hi - lo)
        anchors.append(np.sort(rng.choice(np.arange(lo, hi), size=count, replace=False)))
    return Batch(seqs, anchors)


def validation_batch(cache: FeatureCache, val: list[int], total: int, seed: int) -> Batch:
    rng = np.random.default_rng((seed, 999))
    per = max(1, math.ceil(total / max(len(val), 1)))
    return sample_batch(cache, val, rng, len(val), per)


def lr_at(step: int, steps: int, peak: float, warmup_fraction: float) -> float:
    warmup = max(1, int(warmup_fraction * steps))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


class Trainer:
    """Runs a recipe's stages with checkpoints; `modules` is everything whose weights the state must hold."""

    def __init__(self, out_dir: Path, cache: FeatureCache, modules: dict[str, nn.Module], stages: list[Stage],
                 options: LoopOptions, validate: Callable[[Batch], dict[str, float]] | None = None,
                 progress_factory: Callable | None = None):
        self.out_dir = Path(out_dir)
        self.cache = cache
        self.modules = modules
        self.stages = stages
        self.options = options
        self.validate = validate
        self.progress_factory = progress_factory
        self.train_seqs, self.val_seqs = split_sequences(cache, options.val_fraction, options.seed)
        if not self.train_seqs:
            raise ValueError("no training sequences with a reply of 2+ tokens")
        self.val_batch = validation_batch(cache, self.val_seqs, options.val_anchors, options.seed) \
            if self.val_seqs else None
        self.history = History()
        self.optimizer: torch.optim.Optimizer | None = None

    # ---- state -----------------------------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.out_dir / STATE_FILE

    def _new_optimizer(self, stage: Stage) -> torch.optim.Optimizer:
        params = [p for p in stage.params() if p.requires_grad]
        return torch.optim.AdamW(params, lr=stage.lr, betas=(0.9, 0.95), weight_decay=self.options.weight_decay)

    def save(self) -> None:
        state = {"modules": {k: m.state_dict() for k, m in self.modules.items()},
                 "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                 "history": asdict(self.history), "data_sha256": self.cache.meta.data_sha256}
        tmp = self.state_path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.state_path)

    def try_resume(self) -> bool:
        if not self.state_path.exists():
            return False
        state = torch.load(self.state_path, map_location="cpu", weights_only=True)
        if state.get("data_sha256", self.cache.meta.data_sha256) != self.cache.meta.data_sha256:
            raise UserError(f"{self.state_path}: begun on other training data (data_sha256 "
                            f"{state['data_sha256'][:12]}…, now {self.cache.meta.data_sha256[:12]}…: another work "
                            "dir or --extra-cache); resume with the same data or give another --out")
        for key, module in self.modules.items():
            module.load_state_dict(state["modules"][key])
        self.history = History(**state["history"])
        if self.history.stage < len(self.stages):
            stage = self.stages[self.history.stage]
            stage.on_start()
            self.optimizer = self._new_optimizer(stage)
            if state["optimizer"] is not None and self.history.step > 0:
                self.optimizer.load_state_dict(state["optimizer"])
        return True

    # ---- running ---------------------------------------------------------------------------------------------
    def run(self) -> History:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        resumed = self.try_resume()
        bar = self.progress_factory() if self.progress_factory else None
        total_steps = sum(s.steps for s in self.stages)
        done_before = sum(s.steps for s in self.stages[: self.history.stage]) + self.history.step
        handle = bar.add_task("train", total=total_steps, completed=done_before, info="") if bar else None
        started = time.time() - self.history.seconds
        if self.history.cpu_seconds == 0.0:
            self.history.cpu_from_step = done_before
        self._cpu_started = time.process_time() - self.history.cpu_seconds
        try:
            if bar:
                bar.start()
            while self.history.stage < len(self.stages):
                stage = self.stages[self.history.stage]
                if self.optimizer is None or (self.history.step == 0 and not resumed):
                    stage.on_start()
                    self.optimizer = self._new_optimizer(stage)
                resumed = False
                self._run_stage(stage, bar, handle, started)
                self.history.stage += 1
                self.history.step = 0
                self.optimizer = None
                self._clock(started)
                self.save()
        finally:
            if bar:
                bar.stop()
        self._clock(started)
        return self.history

    def _clock(self, started: float) -> None:
        self.history.seconds = time.time() - started
        self.history.cpu_seconds = time.process_time() - self._cpu_started

    def _run_stage(self, stage: Stage, bar, handle, started: float) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        for module in self.modules.values():
            module.train()
        while self.history.step < stage.steps:
            step = self.history.step
            rng = np.random.default_rng((self.options.seed, self.history.stage, step))
            batch = sample_batch(self.cache, self.train_seqs, rng, stage.batch_seqs, stage.anchors_per_seq)
            lr = lr_at(step, stage.steps, stage.lr, self.options.warmup_fraction)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            terms = stage.loss(batch, step / max(1, stage.steps))
            self.optimizer.zero_grad(set_to_none=True)
            terms["loss"].backward()
            if self.options.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, self.options.grad_clip)
            self.optimizer.step()
            self.history.step += 1
            row = {"stage": stage.name, "step": self.history.step, "lr": lr,
                   **{k: float(v.detach()) for k, v in terms.items()}}
            self.history.log.append(row)
            self._clock(started)
            if bar:
                info = " ".join(f"{k} {row[k]:.3f}" for k in terms)
                bar.update(handle, advance=1, info=f"{stage.name} {info}")
            last = self.history.step == stage.steps
            if self.validate and self.val_batch and (self.history.step % self.options.val_every == 0 or last):
                for module in self.modules.values():
                    module.eval()
                with torch.no_grad():
                    metrics = self.validate(self.val_batch)
                for module in self.modules.values():
                    module.train()
                self.history.val.append({"stage": stage.name, "step": self.history.step, **metrics})
                if bar:
                    bar.console.print(f"[dim]{stage.name} step {self.history.step}: " +
                                      " ".join(f"{k} {v:.3f}" for k, v in metrics.items()) + "[/]")
            if self.history.step % self.options.checkpoint_every == 0 and not last:
                self.save()


def final_losses(history: History) -> dict[str, dict[str, float]]:
    """Per stage, the mean of each logged term over its last 10% of steps (at least one step)."""
    by_stage: dict[str, list[dict]] = {}
    for row in history.log:
        by_stage.setdefault(row["stage"], []).append(row)
    out = {}
    for name, rows in by_stage.items():
        tail = rows[-max(1, len(rows) // 10):]
        keys = [k for k in tail[0] if k not in ("stage", "step", "lr")]
        out[name] = {k: sum(r[k] for r in tail) / len(tail) for k in keys}
    return out


def write_json(path: Path, obj) -> None:
    Path(path).write_text(json.dumps(obj, indent=1, sort_keys=True, default=str))
