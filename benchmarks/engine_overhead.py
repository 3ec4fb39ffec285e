"""Engine overhead on the default target, measured in one run.

(a) our `ar` decode tokens/s ÷ HF `generate()` decode tokens/s on the same prompts (want ≥ 1.0);
(b) the share of speculative step time spent outside the drafter and the target verify forward
    (acceptance, KV rollback, bookkeeping), per method (want ≤ 5 %).

Both sides decode a fixed number of tokens (EOS ignored) after a prefill that is not counted:
HF decode time = time(generate N) − time(generate 1). Usage:

    python benchmarks/engine_overhead.py [--target default] [--device cpu] [--prompts 4] [--tokens 64]
        [--methods ngram,dlite]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from evalsuite.engines.hf import PrefixCache
from evalsuite.engines.loop import decode_turn
from evalsuite.methods.base import Sampling, get_method
from evalsuite.target.model import TargetModel
from evalsuite.tasks.base import LoadOptions, get_task
from evalsuite.timing import DeviceClock


def prompts_from(task: str, count: int, target: TargetModel) -> list[list[int]]:
    trajectories = get_task(task).load(LoadOptions(limit=count, seed=0))
    return [target.render(t.turns[0].new_messages) for t in trajectories]


def hf_decode_rate(target: TargetModel, prompt: list[int], tokens: int, clock: DeviceClock) -> float:
    ids = torch.tensor([prompt], device=target.device)
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0)

    def timed(n: int) -> float:
        start = clock.now()
        with torch.inference_mode():
            target.model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
        return clock.now() - start

    full, prefill_only = timed(tokens), timed(1)
    return (tokens - 1) / (full - prefill_only)


def our_decode(target: TargetModel, drafter, prompt: list[int], tokens: int, k: int, clock: DeviceClock):
    prefix = PrefixCache(target, drafter.feature_layers)
    prefix.prefill(prompt)
    context = torch.tensor(prompt, device=target.device)
    return decode_turn(target, drafter, prefix.cache, context, prefix.features_for(drafter.feature_layers),
                       prefix.last_logits, k, Sampling(), tokens, None, clock)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--task", default="gsm8k")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--methods", default="ngram")
    args = parser.parse_args()

    target = TargetModel.load(args.target, args.device, args.dtype)
    target.stop_ids = frozenset()  # fixed-length decodes on both sides
    clock = DeviceClock(target.device)
    prompts = prompts_from(args.task, args.prompts, target)
    ar = get_method("ar").factory(target, {})
    drafters = {name: get_method(name).factory(target, {}) for name in args.methods.split(",") if name}

    # warm-up: both paths once, untimed
    hf_decode_rate(target, prompts[0], 8, clock)
    our_decode(target, ar, prompts[0], 8, args.k, clock)
    for drafter in drafters.values():
        our_decode(target, drafter, prompts[0], 8, args.k, clock)

    ours, theirs = [], []
    overhead = {name: [0.0, 0.0] for name in drafters}
    def our_rate(prompt):
        result = our_decode(target, ar, prompt, args.tokens, args.k, clock)
        return sum(s.emitted for s in result.steps) / sum(s.step_s for s in result.steps)

    for prompt in prompts:
        # ABBA order per prompt, so that a drift in machine load does not favour either side
        a1, b1, b2, a2 = our_rate(prompt), hf_decode_rate(target, prompt, args.tokens, clock), \
            hf_decode_rate(target, prompt, args.tokens, clock), our_rate(prompt)
        ours.append((a1 + a2) / 2)
        theirs.append((b1 + b2) / 2)
        for name, drafter in drafters.items():
            result = our_decode(target, drafter, prompt, args.tokens, args.k, clock)
            overhead[name][0] += sum(s.step_s - s.draft_s - s.verify_s for s in result.steps)
            overhead[name][1] += sum(s.step_s for s in result.steps)

    print(f"target: {target.name} on {target.device} ({str(target.dtype).removeprefix('torch.')}); "
          f"{len(prompts)} {args.task} prompts, {args.tokens} tokens each, k={args.k}")
    ratios = [a / b for a, b in zip(ours, theirs)]
    print(f"(a) AR decode: ours {statistics.mean(ours):.2f} tok/s, HF generate {statistics.mean(theirs):.2f} tok/s, "
          f"ratio ours/HF = {statistics.mean(ours) / statistics.mean(theirs):.3f} (per-prompt median "
          f"{statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f})  (want >= 1.0)")
    for name, (outside, total) in overhead.items():
        print(f"(b) {name}: share of step time outside draft + verify forwards = {100 * outside / total:.2f} %  "
              f"(want <= 5 %)")


if __name__ == "__main__":
    main()
