"""`evalsuite train`: prompts → target-regenerated replies → feature cache → recipe → released checkpoint + card.

Every stage writes into a work directory keyed by the target and data choice, and every stage resumes:
- `prompts.jsonl` + `heldout.json` (the explicit held-out list and the filtering counts),
- `responses.jsonl` (appended per generation batch),
- `features/` (the fp16 cache, resumed per batch),
- `<out>/train_state.pt` (the training state, every `checkpoint_every` steps).
The feature cache holds the union of the target layers every recipe reads at its default sizes, so one cache
serves them all. A learned method's recipe is found by its name (`recipes.common.recipe_for`, one module of
`evalsuite/train/recipes/` each); a method without one is a one-line error.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from evalsuite.errors import UserError
from evalsuite.hashing import file_sha256
from evalsuite.target.model import TargetModel, cache_root, weights_hash
from evalsuite.train import data as data_mod
from evalsuite.train import mixture
from evalsuite.train.features import FeatureCache, FeatureSpec, JoinedCache, build_features
from evalsuite.train.generate import GenerationOptions, logged_replies, read_sequences, regenerate
from evalsuite.train.loop import LoopOptions, Trainer, final_losses, split_sequences, write_json
from evalsuite.train.recipes.common import parse_overrides, recipe_for, recipes


@dataclass
class TrainRequest:
    method: str
    target: str = "default"
    data: list[str] = field(default_factory=lambda: [data_mod.SHAREGPT])
    out: Path = Path("drafter")
    work_dir: Path | None = None
    steps: int | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    prompts: data_mod.PromptOptions = field(default_factory=data_mod.PromptOptions)
    generation: GenerationOptions = field(default_factory=GenerationOptions)
    topk: int = 32
    heldout_extra: list[Path] = field(default_factory=list)
    loop: LoopOptions = field(default_factory=LoopOptions)
    command: str = ""
    prepare_only: bool = False  # stop after the feature cache (lets parallel trainings share a finished cache)
    max_seq_len: int = 0  # feature cache: keep the last N positions of each sequence (0 = whole); FeatureSpec
    init: Path | None = None  # warm start from a released checkpoint of the same method and sizes
    # finished work directories of the same target whose feature caches are trained on beside this one (JoinedCache)
    extra_caches: list[Path] = field(default_factory=list)


@dataclass
class Reporter:
    """How the pipeline talks to the CLI: a message sink and a factory for rich progress bars."""

    say: Callable[[str], None] = lambda text: None
    progress: Callable[[], object] | None = None


def all_feature_layers(num_target_layers: int, method: str, options) -> tuple[int, ...]:
    """The union over every recipe at its default sizes, plus what `method` reads with its options."""
    layers = set()
    for name, recipe in recipes().items():
        layers.update(recipe.feature_layers(num_target_layers, options if name == method else recipe.options_type()))
    return tuple(sorted(layers))


def work_dir_for(request: TrainRequest, target: TargetModel, target_sha: str) -> Path:
    if request.work_dir is not None:
        return Path(request.work_dir)
    prompts = asdict(request.prompts)
    if not prompts["max_trajectories"]:
        del prompts["max_trajectories"]  # added later: keys of work dirs made before it stay the same
    if not prompts["math_only"]:
        del prompts["math_only"]  # likewise
    key = json.dumps({"target": target_sha, "data": request.data, "prompts": prompts,
                      "generation": asdict(request.generation), "extra": [str(p) for p in request.heldout_extra],
                      **({"max_seq_len": request.max_seq_len} if request.max_seq_len else {})}, sort_keys=True)
    return cache_root() / "train" / hashlib.sha256(key.encode()).hexdigest()[:16]


def _timed(timings: dict, name: str):
    class Timer:
        def __enter__(self):
            self.t0 = time.time()

        def __exit__(self, *exc):
            timings[name] = timings.get(name, 0.0) + time.time() - self.t0
    return Timer()


def prepare_data(request: TrainRequest, target: TargetModel, target_sha: str, layers: tuple[int, ...],
                 reporter: Reporter, timings: dict) -> tuple[Path, FeatureCache, dict]:
    work = work_dir_for(request, target, target_sha)
    work.mkdir(parents=True, exist_ok=True)
    prompts_path, heldout_path = work / "prompts.jsonl", work / "heldout.json"
    with _timed(timings, "prompts_s"):
        if not prompts_path.exists():
            reporter.say("building the held-out list from every registered evaluation task …")
            heldout = data_mod.build_heldout(request.heldout_extra)
            selected = mixture.select_prompts(request.data, heldout, request.prompts)
            if request.prompts.math_only:
                selected = selected.math_subset()
                if not selected.conversations:
                    raise UserError(f"--math-only: none of the prompts selected from {','.join(request.data)} is "
                                    "math-like (a first user turn with a word problem)")
            write_json(heldout_path, {"summary": heldout.summary(), "selection": selected.stats,
                                      "extra_paths": [str(p) for p in request.heldout_extra],
                                      "samples": heldout.samples})
            selected.write(prompts_path)
        conversations = data_mod.PromptSet.read(prompts_path)
    responses = work / "responses.jsonl"
    with _timed(timings, "generation_s"):
        if request.generation.agent_labels == "logged":
            logged_replies(target, [c for c in conversations if c.logged_reply], responses, request.generation)
        elif request.generation.agent_labels != "regenerated":
            raise UserError(f"--agent-labels {request.generation.agent_labels}: choose regenerated or logged")
        done = {s.conv_id for s in read_sequences(responses)}
        todo = [c for c in conversations if c.conv_id not in done
                and not (request.generation.agent_labels == "logged" and c.logged_reply)]
        if todo:
            reporter.say(f"regenerating replies with the target (greedy): {len(todo)} prompts to go")
            bar = reporter.progress() if reporter.progress else None
            handle = bar.add_task("generate", total=len(todo), info="") if bar else None
            counted = {"tokens": 0, "t0": time.time()}

            def tick(seqs: int, tokens: int) -> None:
                counted["tokens"] += tokens
                rate = counted["tokens"] / max(time.time() - counted["t0"], 1e-9)
                if bar:
                    bar.update(handle, advance=seqs, info=f"{counted['tokens']} tokens, {rate:.0f} tok/s")
            if bar:
                bar.start()
            try:
                regenerate(target, todo, responses, request.generation, tick)
            finally:
                if bar:
                    bar.stop()
    wanted = {c.conv_id for c in conversations}
    sequences = [s for s in read_sequences(responses) if s.conv_id in wanted and s.response_ids]
    with _timed(timings, "features_s"):
        features_dir = work / "features"
        progress = features_dir / "progress.json"
        if not progress.exists() or json.loads(progress.read_text())["done"] < len(sequences):
            reporter.say(f"teacher-forced feature pass over {len(sequences)} sequences (layers {list(layers)})")
            bar = reporter.progress() if reporter.progress else None
            handle = bar.add_task("features", total=len(sequences), info="") if bar else None
            if bar:
                bar.start()
            try:
                spec = FeatureSpec(layers, request.topk, max_seq_len=request.max_seq_len,
                                   labels=feature_labels(features_dir))
                cache = build_features(target, sequences, features_dir, spec, target_sha,
                                       lambda n, tokens: bar.update(handle, advance=n) if bar else None)
            finally:
                if bar:
                    bar.stop()
        else:
            cache = FeatureCache(features_dir)
    missing = [j for j in layers if j not in cache.layers]
    if missing:
        raise UserError(f"the feature cache in {work} lacks target layers {missing}; pass --work-dir to build "
                        "another cache")
    stats = work_stats(work, cache)
    if request.extra_caches:
        extras = [_extra_cache(Path(extra)) for extra in request.extra_caches]
        cache = JoinedCache([cache] + [c for c, _ in extras])
        stats["extra_caches"] = [s for _, s in extras]
        for key in ("sequences", "tokens", "reply_tokens", "eos_replies", "logged_label_sequences",
                    "logged_label_reply_tokens", "prompts"):
            stats[key] += sum(s[key] for _, s in extras)
    return work, cache, stats


def work_stats(work: Path, cache: FeatureCache) -> dict:
    """What a finished work directory holds: its prompts, replies, cache sizes, held-out summary and selection."""
    conversations = data_mod.PromptSet.read(work / "prompts.jsonl")
    wanted = {c.conv_id for c in conversations}
    replies = [s for s in read_sequences(work / "responses.jsonl") if s.conv_id in wanted]
    sequences = [s for s in replies if s.response_ids]
    heldout = json.loads((work / "heldout.json").read_text())
    return {"work_dir": str(work), "prompts": len(conversations), "sequences": len(sequences),
            "tokens": cache.meta.num_tokens, "reply_tokens": cache.meta.num_response_tokens,
            "eos_replies": sum(1 for s in replies if s.stop == "eos"),
            "logged_label_sequences": sum(1 for s in sequences if s.labels == "logged"),
            "logged_label_reply_tokens": sum(len(s.response_ids) for s in sequences if s.labels == "logged"),
            "heldout": heldout["summary"], "selection": heldout["selection"]}


def _extra_cache(work: Path) -> tuple[FeatureCache, dict]:
    """A finished work directory joined to this training (`--extra-cache`), with its stats."""
    for name in ("prompts.jsonl", "heldout.json", "responses.jsonl", "features/meta.json"):
        if not (work / name).exists():
            raise UserError(f"--extra-cache {work}: no {name} there; give a work directory whose data stage has "
                            "finished (evalsuite train --prepare-only --work-dir DIR)")
    cache = FeatureCache(work / "features")
    return cache, work_stats(work, cache)


def feature_labels(features_dir: Path) -> str:
    """Label the reply positions only (FeatureSpec.labels), except when resuming a cache begun with labels
    everywhere (before the option existed)."""
    meta = features_dir / "meta.json"
    if meta.exists():
        return json.loads(meta.read_text()).get("labels", "all")
    return "reply"


def _no_dirs(item: str) -> str:
    """A --data item without the directories of its path (committed reports hold no machine paths)."""
    return ":".join(Path(part).name if "/" in part else part for part in item.split(":"))


def build_recipe(method: str, target: TargetModel, cache: FeatureCache, options, train_sequences: list[int]):
    target.model.requires_grad_(False)  # the target's embedding and lm_head are used frozen
    return recipe_for(method)(target, cache, options, train_sequences)


def train(request: TrainRequest, reporter: Reporter = Reporter()) -> dict:
    recipe_type = recipe_for(request.method)
    options = parse_overrides(recipe_type.options_type, request.overrides, request.method)
    steps = request.steps or recipe_type.default_steps
    if steps < 1:
        raise UserError(f"--steps {steps}: must be >= 1")
    if request.loop.threads:
        # On a shared, oversubscribed CPU one thread is far faster than two spinning OpenMP workers.
        torch.set_num_threads(request.loop.threads)
    timings: dict[str, float] = {}
    with _timed(timings, "load_target_s"):
        # row-major: training gathers lm_head rows (the training vocabulary), which column-major storage scatters
        target = TargetModel.load(request.target, weight_layout="row-major")
    target_sha = weights_hash(target.model_dir)
    layers = all_feature_layers(target.num_layers, request.method, options)
    work, cache, data_stats = prepare_data(request, target, target_sha, layers, reporter, timings)
    if request.prepare_only:
        return {"data": data_stats, "timings_s": timings}
    train_seqs, val_seqs = split_sequences(cache, request.loop.val_fraction, request.loop.seed)
    recipe = build_recipe(request.method, target, cache, options, train_seqs)
    init = recipe.load_init(Path(request.init)) if request.init is not None else None
    trainer = Trainer(request.out, cache, recipe.modules(), recipe.stages(steps), request.loop, recipe.validate,
                      reporter.progress)
    reporter.say(f"training {request.method}: {steps} steps on {len(train_seqs)} sequences "
                 f"({len(val_seqs)} held back for validation) → {request.out}")
    with _timed(timings, "training_s"):
        history = trainer.run()
    config = recipe.export(request.out)
    sha = weights_hash(str(request.out))
    report = {
        "method": request.method, "target": target.name, "target_sha256": target_sha,
        "checkpoint_sha256": sha, "model_safetensors_sha256": file_sha256(Path(request.out) / "model.safetensors"),
        "checkpoint_bytes": (Path(request.out) / "model.safetensors").stat().st_size,
        "steps": steps, "stages": [{"name": s.name, "steps": s.steps, "lr": s.lr, "batch_seqs": s.batch_seqs,
                                    "anchors_per_seq": s.anchors_per_seq} for s in trainer.stages],
        "final_losses": final_losses(history), "validation": history.val[-1] if history.val else {},
        "validation_history": history.val, "training_seconds": history.seconds,
        "training_cpu_seconds": history.cpu_seconds, "training_cpu_from_step": history.cpu_from_step,
        "timings_s": timings,
        "data": data_stats, "recipe": recipe.describe(), "loop": asdict(request.loop),
        "command": request.command or shlex.join(["evalsuite"] + sys.argv[1:]),
        "torch_threads": torch.get_num_threads(), "data_sources": [_no_dirs(d) for d in request.data] + [
            f"{src['name']}:{src['file']}" for extra in data_stats.get("extra_caches", [])
            for src in extra["selection"].get("sources", [])],
        "max_seq_len": request.max_seq_len, "feature_layers": list(cache.layers),
        "topk": request.topk, "generation": asdict(request.generation), "init": init,
    }
    write_json(Path(request.out) / "training_report.json", report)
    from evalsuite.train.card import write_model_card

    write_model_card(Path(request.out), report, config)
    return report
