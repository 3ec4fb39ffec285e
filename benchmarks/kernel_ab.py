"""Two builds of evalsuite's CPU kernels timed against each other in one process, on the same target and weights.

A change to `evalsuite/target/cpu_kernels.py` is judged by how a decode and a verify block of the target change. Two
runs of `context_cost.py` at two commits do not settle it on a shared VM, whose memory and cores drift by tens of
percent within minutes (`benchmarks/results/machine_drift_cpu.txt`). Here the kernels' source at `--base` (a git
revision) and the working tree's are built side by side (each into its own directory under evalsuite's cache), the
target is loaded once, and `context_cost.measure` times every context, build and block size in turn in every repeat,
each build's calls made through its own module over the same packed weights. The two builds are checked to give the
same bits on the target's products and attention first: a change of blocking or prefetching must not change a result.

Usage: python benchmarks/kernel_ab.py --base HEAD~1 [--target default] [--contexts 512,2048,8000] [--repeats 11]
       [--threads 2]
Prints, per context and build, the median decode and verify-2/4/8 ms (each ÷ the decode) and the decode ÷ the
memory floor measured in the same run, then each verify's time with the working tree's build ÷ the base's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import context_cost  # noqa: E402

from evalsuite.target import cpu_kernels  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SOURCE_FILE = "evalsuite/target/cpu_kernels.py"


def source_at(revision: str) -> str:
    """The kernels' C++ source in `SOURCE_FILE` at git `revision`."""
    shown = subprocess.run(["git", "show", f"{revision}:{SOURCE_FILE}"], capture_output=True, text=True, cwd=ROOT)
    if shown.returncode != 0:
        raise SystemExit(f"--base {revision}: {shown.stderr.strip().splitlines()[0] if shown.stderr else 'no such file'}")
    text = shown.stdout
    if '_SOURCE = r"""' not in text:
        raise SystemExit(f"--base {revision}: {SOURCE_FILE} holds no kernel source there")
    return text.split('_SOURCE = r"""', 1)[1].split('"""', 1)[0]


def build(source: str, label: str):
    """The kernels built from `source` (cached by its hash, beside the regular builds)."""
    tag = cpu_kernels.source_tag(source)
    directory = cpu_kernels.build_directory().parent / f"ab-{tag}"
    return cpu_kernels.compile_source(directory, f"evalsuite_ab_{label}_{tag}", ["-march=native"], source)


class _Through:
    """The target with every forward made through one build of the kernels."""

    def __init__(self, target, module):
        self._target, self._module = target, module

    def __getattr__(self, name):
        return getattr(self._target, name)

    def forward(self, *args, **kwargs):
        cpu_kernels._build = lambda: self._module
        return self._target.forward(*args, **kwargs)


def same_bits(target, modules: dict) -> None:
    """Each build's products of 1-8 rows over the target's first layer and its head, and its attention of 1-8-row
    blocks over 300 and 2,100 keys in the target's head shape, the same bits."""
    fused = target.fused
    weights = [(fused.layers[0].packed[n], getattr(fused.layers[0], n).shape[0]) for n in ("qkv", "o", "gate_up", "down")]
    weights.append((fused.head_packed, fused.head.shape[0]))
    generator = torch.Generator().manual_seed(0)
    for packed, out_features in weights:
        for rows in range(1, 9):
            x = torch.randn(rows, packed.shape[1], generator=generator)
            results = [module.linear(x, packed, out_features) for module in modules.values()]
            if not all(torch.equal(results[0], r) for r in results[1:]):
                raise SystemExit(f"the builds differ on a {rows}-row product of a [{out_features}, {packed.shape[1]}] weight")
    groups = fused.heads // fused.kv_heads
    for rows in range(1, 9):
        for length in (300, 2100):
            q = torch.randn(1, fused.kv_heads, groups * rows, fused.head_dim, generator=generator)
            k, v = (torch.randn(1, fused.kv_heads, length, fused.head_dim, generator=generator) for _ in range(2))
            results = [module.attention(q, k, v, rows, fused.head_dim ** -0.5) for module in modules.values()]
            if not all(torch.equal(results[0], r) for r in results[1:]):
                raise SystemExit(f"the builds differ on the attention of a {rows}-row block over {length} keys")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git revision whose kernels are the baseline")
    parser.add_argument("--target", default="default")
    parser.add_argument("--contexts", default="512,2048,8000")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not cpu_kernels.available():
        raise SystemExit(f"evalsuite's CPU kernels are unavailable here: {cpu_kernels.reason()}")
    modules = {"base": build(source_at(args.base), "base"), "tree": build(cpu_kernels._SOURCE, "tree")}
    torch.set_num_threads(args.threads)
    cpu_kernels._build = lambda: modules["tree"]
    target = context_cost.load(argparse.Namespace(target=args.target, device="cpu", tiny=False),
                               weight_layout="fused+panel")
    same_bits(target, modules)
    contexts = [int(c) for c in args.contexts.split(",")]
    targets = {name: (_Through(target, module), args.threads) for name, module in modules.items()}
    medians, bandwidth, _ = context_cost.measure(targets, contexts, args.repeats, [args.threads])
    weights, kv = context_cost.weight_bytes(target), context_cost.kv_bytes_per_token(target)
    print(f"base: {args.base}'s kernels; tree: the working tree's; {args.repeats} repeats (medians; each repeat "
          f"times every context, build and block size in turn), {args.threads} threads, copy bandwidth "
          f"{bandwidth[args.threads] / 1e9:.1f} GB/s; the same bits checked on 1-8-row products and attention first")
    for context in contexts:
        floor = (weights + kv * context) / bandwidth[args.threads]
        for name in modules:
            row = medians[context][name]
            blocks = "  ".join(f"verify-{n} {1e3 * row[n]:6.1f} ({row[n] / row[1]:4.2f})" for n in sorted(row) if n > 1)
            print(f"{context:6d} {name:4s}  decode {1e3 * row[1]:6.1f} ms (÷ floor {row[1] / floor:4.2f})  {blocks}")
        change = "  ".join(f"{'decode' if n == 1 else f'verify-{n}'} {medians[context]['tree'][n] / medians[context]['base'][n]:4.2f}"
                           for n in sorted(medians[context]['tree']))
        print(f"{context:6d} tree ÷ base: {change}")


if __name__ == "__main__":
    main()
