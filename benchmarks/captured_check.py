"""The captured path against the fused decoder's ordinary forward on one target: the same greedy tokens?

Greedy decoding of `--tokens` tokens after a random `--context`-token prompt, then verify blocks of 1 … k+1 tokens
with rollbacks, once through CUDA-graph replays (`--cuda-graphs on`) and once without; prints the number of
differing greedy tokens and the largest logit difference, and the capture's size and time. On a CPU (no graphs)
the same static-shape forwards run eagerly, which is what tests/test_captured.py checks.

Usage (the GPU machine; benchmarks/gpu_check.sh runs it):
    python benchmarks/captured_check.py --target qwen3-8b-random --device cuda [--context 2048] [--tokens 64]
    python benchmarks/captured_check.py --target qwen3-8b-random --tiny          # the code path on a CPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from evalsuite.target.captured import CapturedSteps

K = 7


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen3-8b-random")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from draft_cost import RANDOM_TARGETS, random_target

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    shape = "tiny" if args.tiny else RANDOM_TARGETS[args.target]
    graphs = args.device.startswith("cuda")
    plain = random_target(shape, args.target, args.device, dtype, weight_layout="fused", cuda_graphs="off")
    captured = random_target(shape, args.target, args.device, dtype, weight_layout="fused",
                             cuda_graphs="on" if graphs else "off")
    capacity = args.context + args.tokens + 4 * (K + 1) + 1
    for target in (plain, captured):
        target.prepare_blocks(K + 1)
    if not graphs:  # the static-shape forwards, eagerly
        captured.captured = CapturedSteps(captured.fused, captured.config, capacity, K + 1, graphs=False)
    start = time.perf_counter()
    recorded = captured.prepare_layers([()])
    capture_s = time.perf_counter() - start
    generator = torch.Generator().manual_seed(0)
    vocab = plain.vocab_size
    prompt = torch.randint(4, vocab, (args.context,), generator=generator).to(args.device)
    blocks = [torch.randint(4, vocab, (n,), generator=generator).to(args.device) for n in range(1, K + 2)]
    runs = []
    for target in (plain, captured):
        cache = target.new_cache()
        cache.reserve(capacity)
        logits = target.forward(prompt, cache, last_only=True).logits
        tokens, block_logits = [int(logits[-1].argmax())], []
        for _ in range(args.tokens - 1):
            logits = target.forward(torch.tensor(tokens[-1:], device=args.device), cache).logits
            tokens.append(int(logits[-1].argmax()))
        for block in blocks:  # verify blocks, each rolled back to half its length
            length = cache.get_seq_length()
            block_logits.append(target.forward(block, cache).logits.float())
            cache.crop_to(length + max(block.numel() // 2, 1))
        runs.append((tokens, block_logits))
    differing = sum(a != b for a, b in zip(runs[0][0], runs[1][0]))
    largest = max(float((a - b).abs().max()) for a, b in zip(runs[0][1], runs[1][1]))
    argmax_equal = all(torch.equal(a.argmax(-1), b.argmax(-1)) for a, b in zip(runs[0][1], runs[1][1]))
    mode = "CUDA graphs" if graphs else "static-shape forwards run eagerly (no CUDA)"
    print(f"{plain.name} ({shape}) on {args.device}, {dtype}: {mode}; {recorded} forwards recorded in "
          f"{capture_s:.1f} s; greedy tokens after {args.context}: {differing} of {args.tokens} differ; verify "
          f"blocks 1…{K + 1}: greedy {'identical' if argmax_equal else 'DIFFERENT'}, largest logit difference "
          f"{largest:.3g}")
    if differing or not argmax_equal:
        sys.exit(1)


if __name__ == "__main__":
    main()
