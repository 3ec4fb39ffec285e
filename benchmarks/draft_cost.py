"""Draft cost versus context length: per method, the time of one proposal (K drafts) and the draft-side memory.

Each method is built UNTRAINED (random-init, default size for the target: every learned method falls back to
that when no checkpoint is given), so the numbers measure cost, not quality. For each context length n:

1. the target prefills real text (GSM8K and MT-Bench from data/, repeated to length) in chunks and hands
   over its features, exactly as the runner does;
2. `start_turn` absorbs the n-token context (timed together with the first proposal, since some drafters
   defer that work to it);
3. a loop of warm-up + timed steps, the methods taking turns: `propose(K)` (the engine's draft time), then
   `commit` of one token (the bonus only, with the target feature of the old anchor; timed separately and
   added for the per-step draft cost, as the engine's draft_s counts propose + commit: some drafters do
   their cache extension there, others in the next proposal);
4. `state_bytes()` after the last step: `history` (grows with the context: draft KV, cached features) and
   `working` (per-step scratch).

Medians over the timed steps. CUDA timings use events after a device sync. Usage:

    nice -n 10 python benchmarks/draft_cost.py                        # SmolLM2-135M, 512/2k/4k/8k, fp32 CPU
    python benchmarks/draft_cost.py --target qwen3-8b-random --device cuda   # bf16, 2k/8k/32k/64k
    python benchmarks/draft_cost.py --target qwen3-8b-random --tiny          # the same code path, tiny shapes

`--shipped` measures the drafters shipped for the target (as runs load them) instead of random-init ones;
`--draft-products panel+attention,panel,torch` measures each learned drafter once per choice in the same run:
`panel+attention` as runs build it where the target runs on the panels (`evalsuite.methods.base.build_method`: its
own products on the target's panels and its draft attention on evalsuite's attention kernel), `panel` the same with
its attention on torch's SDPA, `torch` as the factory alone builds it (torch's products and SDPA), e.g.
`--target qwen2.5-coder-0.5b --shipped --draft-products panel+attention,panel,torch`. The default, `run`, is
whatever `build_method` gives on this target (one build per drafter, unlabelled).

`--methods` takes names or method labels `name:key=value[:key=value…]` (as `evalsuite run --method` reads them,
evalsuite.catalog), e.g. `eagle3:format=specforge:draft_vocab_size=32000`, `dflash:layout=block7` or
`eagle3:window=2048`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from evalsuite.catalog import METHODS, method_spec
from evalsuite.errors import UserError
from evalsuite.methods.base import Method, Sampling, build_method, get_method
from evalsuite.profile.shapes import SHAPES, real_text_ids, shape_config
from evalsuite.profile.shapes import random_target as profile_random_target
from evalsuite.target.model import TargetModel
from evalsuite.timing import DeviceClock

BASELINES = ("ar", "ngram")

# Randomly initialised targets built from a config (no download): the shapes of evalsuite.profile.shapes.
RANDOM_TARGETS = {"qwen3-8b-random": "qwen3-8b", "qwen3-4b-random": "qwen3-4b"}
# `--tiny`: the random-target code path at toy sizes (deep enough for distinct feature layers).
TINY_SHAPE = SHAPES["tiny"][1]
# The random targets' released drafter variants worth timing next to the defaults.
RELEASED_VARIANTS = ["dlite", "eagle3", "eagle3:format=specforge:draft_vocab_size=32000", "dflash",
                     "dflash:layout=block7", "dspark"]

CONTEXTS = {"default": [512, 2048, 4096, 8192], "random": [2048, 8192, 32768, 65536], "tiny": [64, 256]}


@dataclass
class Row:
    method: str
    context: int
    propose_ms: float  # median time of propose(K): the engine's draft time per step
    commit_ms: float  # median time of commit(1 token)
    first_ms: float  # start_turn + the first proposal: absorbing the whole context (some drafters defer it)
    history_bytes: int
    working_bytes: int
    drafted: int  # tokens the last proposal returned


# ---- set-up -----------------------------------------------------------------------------------------------------
def random_target(shape: str, name: str, device: str, dtype: torch.dtype, kv_cache: str = "static",
                  compile: bool = False, weight_layout: str = "row-major", cuda_graphs: str = "off") -> TargetModel:
    """A named shape of evalsuite.profile.shapes with random weights, as loaded (row-major weights unless told)."""
    config, _ = shape_config(shape)
    return profile_random_target(config, name, device, dtype, weight_layout, compile=compile, kv_cache=kv_cache,
                                 cuda_graphs=cuda_graphs)


def load_target(args) -> TargetModel:
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype] \
        if args.dtype else (torch.bfloat16 if args.device.startswith("cuda") else torch.float32)
    if args.target in RANDOM_TARGETS:
        shape = "tiny" if args.tiny else RANDOM_TARGETS[args.target]
        target = random_target(shape, args.target + ("-tiny" if args.tiny else ""), args.device, dtype,
                               weight_layout=args.weight_layout or "row-major")
    elif args.tiny:
        raise UserError("--tiny applies to the random targets (e.g. --target qwen3-8b-random --tiny)")
    else:
        target = TargetModel.load(args.target, args.device, args.dtype, weight_layout=args.weight_layout or "auto")
    target.prepare_blocks(args.k + 1)  # as the engine does (and where the product kernels are chosen)
    return target


def parse_method(spec: str, shipped: bool = False) -> tuple[str, str, dict]:
    """`name` or a label `name:key=value[:key=value…]` (evalsuite.catalog) → (label, method name, options)."""
    variant = method_spec(spec)
    options = variant.parse_options({})
    if variant.needs_checkpoint and not shipped:
        options["drafter"] = "random"  # untrained default-size drafters, even where trained ones ship
    return spec, variant.method, options


PRODUCT_CHOICES = ("run", "panel+attention", "panel", "torch")


def build_drafters(target: TargetModel, specs: list[str], products: list[str], shipped: bool) -> dict:
    """label → method, once per draft-products choice: "run" as the engine builds it (`build_method`),
    "panel+attention" the same where it gives the panels and the attention kernel, "panel" the same with every
    draft attention switched back to SDPA, "torch" by the factory alone."""
    drafters = {}
    for label, name, options in (parse_method(spec, shipped) for spec in specs):
        learned = method_spec(name).needs_checkpoint  # a model-free method has no products of its own: built once
        compared = learned and len(products) > 1
        for choice in products if learned else products[:1]:
            method = get_method(name).factory(target, options) if choice == "torch" else \
                build_method(name, target, options)
            if choice == "torch" and learned:
                method.draft_products = "torch"  # the factory alone: torch's products and SDPA
            built = method.draft_products or ""
            if learned and choice.startswith("panel") and not built.startswith(choice):
                raise UserError(f"--draft-products {choice}: {name} builds as {built or 'torch'} here (the target's "
                                f"layout {target.weight_layout}); the panels need --weight-layout fused+panel on a "
                                "CPU in float32, the attention kernel a drafter whose attention declares it")
            if choice == "panel" and built == "panel+attention":
                for module in method.model.modules():
                    if getattr(module, "kernel_attention", False):
                        module.kernel_attention = False
                method.draft_products = "panel"
            drafters[f"{label} [{choice}]" if compared else label] = method
    return drafters


def default_methods(args) -> list[str]:
    if args.target in RANDOM_TARGETS and not args.tiny:
        return [m for m in RELEASED_VARIANTS if m.partition(":")[0] in METHODS]
    return sorted(m for m in METHODS if m not in BASELINES)


# ---- timing -----------------------------------------------------------------------------------------------------
def prefill_features(target: TargetModel, ids: torch.Tensor, layers: tuple[int, ...], chunk: int) -> torch.Tensor:
    """Target features [n, S, H] of every position, prefilled in chunks (bounded activation memory)."""
    cache = target.new_cache()
    parts = [target.forward(ids[i: i + chunk], cache, layers, last_only=True).hidden
             for i in range(0, ids.numel(), chunk)]
    return torch.cat(parts)


@torch.inference_mode()
def measure(target: TargetModel, drafters: dict[str, Method], contexts: list[int], k: int, steps: int,
            warmup: int, chunk: int, log=print) -> list[Row]:
    """Methods take turns step by step (round robin), so that a burst of machine noise hits them all alike."""
    clock = DeviceClock(target.device)

    def ms(fn):
        seconds, result = clock.time(fn)
        return 1e3 * seconds, result

    layers = tuple(sorted({j for d in drafters.values() for j in d.feature_layers}))
    total = max(contexts) + warmup + steps + 1
    ids = torch.tensor(real_text_ids(target, total), device=target.device)
    log(f"prefilling {total} tokens of real text through the target (features of layers {list(layers)}) …")
    features = prefill_features(target, ids, layers, chunk)
    rows = []
    for n in contexts:
        feats = {label: features[:, [layers.index(j) for j in d.feature_layers]] for label, d in drafters.items()}
        times = {label: {"propose": [], "commit": [], "first": 0.0, "drafted": 0} for label in drafters}
        for label, drafter in drafters.items():
            times[label]["first"], _ = ms(lambda: drafter.start_turn(ids[: n + 1], feats[label][:n]))
        for step in range(warmup + steps):
            anchor = n + step  # the bonus token becomes the new anchor; the old anchor's feature row joins
            for label, drafter in drafters.items():
                propose_ms, proposal = ms(lambda: drafter.propose(k, Sampling(), None))
                commit_ms, _ = ms(lambda: drafter.commit(ids[anchor + 1: anchor + 2],
                                                         feats[label][anchor: anchor + 1]))
                record = times[label]
                if step == 0:  # lazy drafters absorb the context in their first proposal
                    record["first"] += propose_ms
                if step >= warmup:
                    record["propose"].append(propose_ms)
                    record["commit"].append(commit_ms)
                record["drafted"] = int(proposal.tokens.numel())
        for label, drafter in drafters.items():
            record, state = times[label], drafter.state_bytes()
            row = Row(label, n, statistics.median(record["propose"]), statistics.median(record["commit"]),
                      record["first"], state.history, state.working, record["drafted"])
            rows.append(row)
            log(f"  {label:<48} ctx {n:>6}: propose {row.propose_ms:8.2f} ms  commit {row.commit_ms:7.2f} ms  "
                f"history {human_bytes(row.history_bytes):>10}  working {human_bytes(row.working_bytes):>10}")
    return rows


@torch.inference_mode()
def profile_proposals(target: TargetModel, drafters: dict[str, Method], k: int, proposals: int, top: int = 8) -> str:
    """Where each method's proposal spends its time, right after `measure` (each drafter still holds the last
    context): torch.profiler over `proposals` proposals, the `top` operators by own host time and, on CUDA, by own
    device time, per proposal."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if target.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    lines = []
    for label, drafter in drafters.items():
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(proposals):
                drafter.propose(k, Sampling(), None)
            if target.device.type == "cuda":
                torch.cuda.synchronize()
        events = prof.key_averages()
        host = sum(e.self_cpu_time_total for e in events) / proposals / 1e3
        device = sum(e.self_device_time_total for e in events) / proposals / 1e3
        lines.append(f"### {label}: {host:.2f} ms of host operators, {device:.2f} ms of device kernels per proposal")
        lines += top_operators(events, "self_cpu_time_total", proposals, top, "host ")
        lines += top_operators(events, "self_device_time_total", proposals, top, "device ")
    return "\n".join(lines)


def top_operators(events, key: str, calls: int, top: int, prefix: str = "") -> list[str]:
    """The `top` profiler events by `key` (an event's own time, µs), per call: 'ms  ×count  name' lines."""
    ranked = [e for e in sorted(events, key=lambda e: -getattr(e, key)) if getattr(e, key) > 0][:top]
    return [f"    {prefix}{getattr(e, key) / calls / 1e3:8.3f} ms  x{e.count // calls:<5d} {e.key[:90]}" for e in ranked]


# ---- output -----------------------------------------------------------------------------------------------------
def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def markdown(rows: list[Row], k: int) -> str:
    lines = [f"| method | context | draft ms / step (propose K={k} + commit) | propose ms | commit ms | "
             "start of turn + 1st proposal ms | draft state: history | working |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.method} | {r.context} | {r.propose_ms + r.commit_ms:.2f} | {r.propose_ms:.2f} | "
                     f"{r.commit_ms:.2f} | {r.first_ms:.1f} | {human_bytes(r.history_bytes)} | "
                     f"{human_bytes(r.working_bytes)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default", help="default | a model dir or HF id | "
                        + " | ".join(RANDOM_TARGETS))
    parser.add_argument("--tiny", action="store_true", help="random target at toy sizes (tests the code path)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bf16 on CUDA, else fp32)")
    parser.add_argument("--methods", default=None,
                        help="methods or method labels separated by ';'; default: all learned")
    parser.add_argument("--contexts", default=None, help="comma-separated context lengths in tokens")
    parser.add_argument("-k", type=int, default=7, help="drafts per proposal")
    parser.add_argument("--steps", type=int, default=15, help="timed proposals per method and context")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=4096, help="target prefill chunk")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--weight-layout", default=None,
                        help="the target's, as `evalsuite run --weight-layout` (default: auto; a random target's: row-major)")
    parser.add_argument("--shipped", action="store_true",
                        help="the drafters shipped for the target (as a run loads them), not random-init ones")
    parser.add_argument("--draft-products", default="run",
                        help="comma-separated: run (as runs build drafters), panel+attention (their products on the "
                             "target's panels and their attention on the kernel), panel (the panels, SDPA "
                             "attention) and/or torch (torch's products and SDPA)")
    parser.add_argument("--profile", type=int, default=0,
                        help="then profile this many proposals of each method at the last context (torch.profiler: "
                             "the top operators by own host time and by own device time)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible")

    target = load_target(args)
    kind = "tiny" if args.tiny else ("random" if args.target in RANDOM_TARGETS else "default")
    contexts = [int(c) for c in args.contexts.split(",")] if args.contexts else CONTEXTS[kind]
    specs = args.methods.split(";") if args.methods else default_methods(args)
    products = [p.strip() for p in args.draft_products.split(",") if p.strip()]
    if not products or any(p not in PRODUCT_CHOICES for p in products):
        raise UserError(f"--draft-products {args.draft_products}: choose from {', '.join(PRODUCT_CHOICES)}")
    drafters = build_drafters(target, specs, products, args.shipped)
    for label, drafter in drafters.items():
        info = drafter.describe()
        print(f"{label}: weights {info.get('weights', '?')}, checkpoint {info.get('checkpoint')}", file=sys.stderr)
    print(f"target {target.name}: {target.num_layers} layers, hidden {target.hidden_size}, vocab {target.vocab_size}, "
          f"{target.dtype}, {target.device}; methods {', '.join(drafters)}; K={args.k}", file=sys.stderr)
    rows = measure(target, drafters, contexts, args.k, args.steps, args.warmup, args.chunk,
                   log=lambda s: print(s, file=sys.stderr, flush=True))
    print(markdown(rows, args.k))
    if args.profile:
        print(profile_proposals(target, drafters, args.k, args.profile))
    if args.json:
        Path(args.json).write_text(json.dumps({"target": target.name, "dtype": str(target.dtype),
                                               "device": str(target.device), "k": args.k,
                                               "rows": [asdict(r) for r in rows]}, indent=1))
    return rows


if __name__ == "__main__":
    try:
        main()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
