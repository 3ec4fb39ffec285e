"""Where a captured decode's time goes on a GPU: torch.profiler over CUDA-graph replays of one-token decodes and
8-token verifies of the random Qwen3-8B-shaped target at two contexts; prints the GPU kernel time per forward
against the wall time per forward, and the top kernels.
Usage: python benchmarks/gpu_decode_profile.py [ATTENTION ...]   (the captured path's attentions, each in turn:
masked-sdpa, flash-length, split-k, flash+split; default masked-sdpa)"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_cost import random_target, top_operators  # noqa: E402

from evalsuite.target.captured import CapturedSteps  # noqa: E402
from evalsuite.timing import DeviceClock  # noqa: E402


def main() -> None:
    target = random_target("qwen3-8b", "qwen3-8b-random", "cuda", torch.bfloat16, weight_layout="fused", cuda_graphs="on")

    ids = torch.randint(4, target.vocab_size, (32768,), device="cuda")
    clock = DeviceClock(target.device)
    for attention in sys.argv[1:] or ["masked-sdpa"]:
        target.prepare_blocks(8)
        target.set_captured_attention(attention)
        # a fresh captured cache and fresh graphs: graphs keep the attention they were recorded with
        target.captured = CapturedSteps(target.fused, target.config, target.captured.capacity, 8, graphs=True)
        target.prepare_layers([()])
        print(f"captured attention: {attention}")
        cache = target.new_cache()
        target.forward(ids, cache, last_only=True)
        for context in (32768, 1024):  # descending: crop_to only shortens the cache
            for n in (1, 8):
                block = ids[:n].clone()
                for _ in range(3):
                    cache.crop_to(context)
                    target.forward(block, cache)
                start = clock.now()
                for _ in range(20):
                    cache.crop_to(context)
                    target.forward(block, cache)
                wall = (clock.now() - start) / 20
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        cache.crop_to(context)
                        target.forward(block, cache)
                    torch.cuda.synchronize()
                events = prof.key_averages()
                total = sum(e.self_device_time_total for e in events) / 5 / 1e3
                print(f"context {context} block {n}: wall {wall * 1e3:.2f} ms/forward, GPU kernels {total:.2f} ms/forward")
                print("\n".join(top_operators(events, "self_device_time_total", 5, 8)))


if __name__ == "__main__":
    main()
