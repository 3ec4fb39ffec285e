"""The captured path against the fused decoder's ordinary forward on one target: the same greedy tokens?

One random target (one copy of its weights) runs the same token sequence three ways, teacher-forced so that one
flipped token cannot change every later context:

- `plain`: the fused decoder's ordinary forward (`--cuda-graphs off`);
- `static`: the static-shape forwards a CUDA graph records (`FusedDecoder.forward_at` over span buckets), eagerly;
- `graphs`: the same forwards replayed from CUDA graphs (only with `--device cuda`).

The sequence: a random `--context`-token prompt, `--tokens` one-token decodes of `plain`'s greedy tokens, then
verify blocks of 1 … k+1 random tokens, each rolled back to half its length. At every position it compares the
logits and the argmax, and calls a differing argmax a near-tie when `plain`'s own logits for the two tokens differ
by no more than the largest logit difference at that position (a different summation order can flip it; a bug
flips tokens by more than its noise).

Pass (exit 0): `graphs` gives `static`'s argmax at every position (the replay of the same kernels), and every
argmax where `static` or `graphs` differs from `plain` is a near-tie. In float32 no flip is expected at all.

Usage (the GPU machine; benchmarks/gpu_check.sh runs it):
    python benchmarks/captured_check.py --target qwen3-8b-random --device cuda [--dtype float32] [--context 2048] \
        [--attention masked-sdpa|flash-length|split-k|flash+split]
    python benchmarks/captured_check.py --target qwen3-8b-random --tiny          # the code path on a CPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from evalsuite.config import CAPTURED_ATTENTIONS
from evalsuite.target.captured import CapturedSteps

K = 7
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run_sequence(target, cache, prompt: torch.Tensor, decode_ids: list[int] | None, tokens: int,
                 blocks: list[torch.Tensor]) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill, `tokens` decodes (teacher-forced on `decode_ids` when given, else greedy), then the verify blocks;
    returns the greedy tokens and every logits row [n, V] in float32 on the CPU."""
    device = prompt.device
    logits = target.forward(prompt, cache, last_only=True).logits
    greedy, rows = [int(logits[-1].argmax())], [logits[-1:].float().cpu()]
    for step in range(tokens - 1):
        fed = greedy[-1] if decode_ids is None else decode_ids[step]
        logits = target.forward(torch.tensor([fed], device=device), cache).logits
        greedy.append(int(logits[-1].argmax()))
        rows.append(logits[-1:].float().cpu())
    for block in blocks:
        length = cache.get_seq_length()
        rows.append(target.forward(block, cache).logits.float().cpu())
        cache.crop_to(length + max(block.numel() // 2, 1))
    return greedy, rows


def compare(reference: list[torch.Tensor], other: list[torch.Tensor]) -> dict:
    """Argmax flips of `other` against `reference`, how many are near-ties, and the largest logit difference
    (absolute, and ÷ the reference logits' standard deviation)."""
    ref, oth = torch.cat(reference), torch.cat(other)
    diff = (ref - oth).abs()
    top_ref, top_oth = ref.argmax(-1), oth.argmax(-1)
    flipped = (top_ref != top_oth).nonzero().flatten()
    rows = torch.arange(ref.shape[0])
    margin = ref[rows, top_ref] - ref[rows, top_oth]  # reference's own preference, ≥ 0
    noise = diff.max(-1).values
    near = int((margin[flipped] <= noise[flipped]).sum())
    return {"positions": ref.shape[0], "flips": len(flipped), "near_ties": near,
            "max_diff": float(diff.max()), "relative": float(diff.max() / ref.std().clamp_min(1e-12))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen3-8b-random")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                        help="default: bfloat16 on CUDA, float32 on a CPU")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--attention", default="masked-sdpa", choices=list(CAPTURED_ATTENTIONS),
                        help="the static-shape forwards' attention (FusedDecoder.captured_attention)")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from draft_cost import RANDOM_TARGETS, random_target

    on_cuda = args.device.startswith("cuda")
    dtype = DTYPES[args.dtype or ("bfloat16" if on_cuda else "float32")]
    shape = "tiny" if args.tiny else RANDOM_TARGETS[args.target]
    target = random_target(shape, args.target, args.device, dtype, weight_layout="fused", cuda_graphs="off")
    target.prepare_blocks(K + 1)
    target.fused.captured_attention = args.attention  # forward_at only: the plain forward is unchanged
    capacity = args.context + args.tokens + 4 * (K + 1) + 1
    ways = {"static": CapturedSteps(target.fused, target.config, capacity, K + 1, graphs=False)}
    capture_s, recorded = 0.0, 0
    if on_cuda:
        ways["graphs"] = CapturedSteps(target.fused, target.config, capacity, K + 1, graphs=True)
        start = time.perf_counter()
        recorded = ways["graphs"].capture([()])
        torch.cuda.synchronize()
        capture_s = time.perf_counter() - start
    generator = torch.Generator().manual_seed(0)
    vocab = target.vocab_size
    prompt = torch.randint(4, vocab, (args.context,), generator=generator).to(args.device)
    blocks = [torch.randint(4, vocab, (n,), generator=generator).to(args.device) for n in range(1, K + 2)]

    greedy, rows = run_sequence(target, target.new_cache(captured=False), prompt, None, args.tokens, blocks)
    results = {}
    for name, steps in ways.items():
        target.captured = steps  # the target's forward now goes through this way's leased cache
        results[name] = run_sequence(target, steps.new_cache(), prompt, greedy[:-1], args.tokens, blocks)[1]
    target.captured = None

    print(f"{target.name} ({shape}) on {args.device}, {dtype}, captured attention {args.attention}: "
          f"{args.context}-token prompt, {args.tokens} "
          f"teacher-forced decodes, verify blocks 1…{K + 1}; " +
          (f"{recorded} CUDA graphs recorded in {capture_s:.1f} s" if on_cuda else "no CUDA: no graphs"))
    failed = False
    pairs = [("static", "plain")] + ([("graphs", "plain"), ("graphs", "static")] if on_cuda else [])
    for name, against in pairs:
        c = compare(rows if against == "plain" else results[against], results[name])
        bad = c["flips"] - c["near_ties"] if against == "plain" else c["flips"]
        failed |= bad > 0
        print(f"  {name} vs {against}: {c['positions']} positions, argmax differs at {c['flips']} "
              f"({c['near_ties']} near-ties), largest logit difference {c['max_diff']:.3g} "
              f"({c['relative']:.3g} logit std) — {'FAIL' if bad else 'ok'}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
