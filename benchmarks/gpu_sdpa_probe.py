"""The attention of one captured decode on a GPU, alone: SDPA of 4 folded query rows per K/V head (Qwen3-8B: 8 K/V
heads, head dim 128, bf16) over `span` keys, with the boolean mask forward_at builds and without one, per backend.
Usage: python benchmarks/gpu_sdpa_probe.py"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main() -> None:
    dev, dt = "cuda", torch.bfloat16
    for span in (2048, 8192, 40968):
        q = torch.randn(1, 8, 4, 128, device=dev, dtype=dt)
        k = torch.randn(1, 8, span, 128, device=dev, dtype=dt)
        v = torch.randn(1, 8, span, 128, device=dev, dtype=dt)
        mask = (torch.arange(span, device=dev).view(1, span) <= span - 10).repeat(4, 1)
        for label, m in (("mask", mask), ("no mask", None)):
            for backend in (None, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION,
                            SDPBackend.MATH):
                try:
                    ctx = sdpa_kernel([backend]) if backend else torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x)
                    with ctx:
                        for _ in range(3):
                            F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        for _ in range(50):
                            F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                        e.record()
                        torch.cuda.synchronize()
                        ms = s.elapsed_time(e) / 50
                    gbs = 2 * k.nbytes / (ms / 1e3) / 1e9
                    print(f"span {span:6d} {label:8s} {str(backend):32s} {ms * 1e3:8.1f} us  {gbs:7.0f} GB/s of K+V")
                except Exception as err:  # a backend that refuses the shape
                    print(f"span {span:6d} {label:8s} {str(backend):32s} refused: {str(err)[:60]}")


if __name__ == "__main__":
    main()
