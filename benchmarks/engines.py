"""Our engine beside the engines a user would pick instead, in one run: same target, same prompt, same context
lengths, same machine, same thread count.

Rows (each a decode of `--new-tokens` greedy tokens after a context of each length; ms per new token, prefill
excluded; ÷ floor = ms ÷ (weight bytes + KV bytes at that context) / copy bandwidth measured now):
- `ours ar` / `ours ngram`: evalsuite's engine (`HfEngine`, the default fused decoder), a plain decode and our
  n-gram prompt lookup (k=7), plus `ours verify-8`: one 8-token verify forward;
- `hf-generate`: transformers' `generate` with its static cache (`cache_implementation="static"`), eager, fp32;
- `llama.cpp f32` / `llama.cpp <quant>`: llama-cpp-python on a GGUF of the same weights, f32 (dequantized from
  the shipped GGUF, so the same values as ours) and the shipped quantisation (the speed a CPU user actually gets),
  plus `llama.cpp f32 + PLD`: its prompt-lookup speculative decoding (7 draft tokens) beside our ngram;
- `vllm`: vLLM's CPU engine from `.venv-vllm` (fp32, prefix caching off), run as a subprocess.
A peer that is not installed, or has nothing to load, is skipped with its reason printed; nothing is dropped.

The prompt: a real agent context (a bundled SWE-Bench trajectory rendered through the target's chat template),
its last N tokens for each context length N, so that prompt lookup has what an agent context offers.

    python benchmarks/engines.py [--target default] [--contexts 512,2048,4096] [--new-tokens 64] [--repeats 3]
        [--peers ours,hf-generate,llama-cpp,vllm] [--threads N]
Timing: every engine is warmed up on the shape first; repeats interleave the engines; medians are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
PEERS = ("ours", "hf-generate", "llama-cpp", "vllm")


def agent_context(target, length: int) -> list[int]:
    """The last `length` tokens of a bundled SWE-Bench trajectory's full logged context (repeated if short)."""
    from evalsuite.tasks.base import LoadOptions, get_task

    trajectories = get_task("swebench").load(LoadOptions(limit=5, seed=0))
    longest = max(trajectories, key=lambda t: len(t.turns))
    messages = []
    for turn in longest.turns:
        messages.extend(turn.new_messages)
        if turn.logged_reply is not None:
            messages.append(turn.logged_reply)
    ids = target.render(messages)
    while len(ids) < length:
        ids = ids + ids
    return ids[-length:]


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ---- ours ---------------------------------------------------------------------------------------------------------
def ours(args, contexts: dict[int, list[int]]) -> list[dict]:
    from evalsuite.config import RunConfig
    from evalsuite.engines.hf import HfEngine
    from evalsuite.metrics import tau_of

    config = RunConfig(methods=["ngram"], task="swebench", target=args.target, max_new_tokens=args.new_tokens,
                       k=7, threads=torch.get_num_threads())
    engine = HfEngine(config)
    engine.start(["ar", "ngram"], torch.get_num_threads())
    rows = []
    for length, ids in contexts.items():
        engine.begin_trajectory()
        methods = ("ar", "ngram")
        for method in methods:  # warm-up: the shapes of this context, untimed
            engine.decode(method, ids, 0)
        results = {method: [] for method in methods}
        for _ in range(args.repeats):  # interleaved repeats
            for method in methods:
                results[method].append(engine.decode(method, ids, 0))
        for method, runs in results.items():
            ms = statistics.median(1e3 * r.decode_s / len(r.output_ids) for r in runs)
            steps = runs[0].steps
            tau = tau_of([s.num_accepted for s in steps], [s.budget_limited for s in steps])
            rows.append({"engine": f"ours {method}", "precision": "fp32", "context": length, "ms": ms,
                         "tau": round(tau, 2) if method != "ar" else None,
                         "tokens": runs[0].output_ids})
        cache = engine.prefix.cache  # one 8-token verify forward after the context
        block = torch.tensor(ids[-8:], dtype=torch.long)
        target = engine.target

        def verify():
            target.forward(block, cache)
            cache.crop_to(len(ids))
        verify()
        rows.append({"engine": "ours verify-8", "precision": "fp32", "context": length,
                     "ms": 1e3 * median_time(verify, 5 * args.repeats)})
    engine.close()
    return rows


# ---- transformers' generate with a static cache ---------------------------------------------------------------------
def hf_generate(args, contexts: dict[int, list[int]], model_dir: str) -> list[dict]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = []
    for length, ids in contexts.items():
        prompt = torch.tensor([ids])

        def generate(n):
            with torch.inference_mode():
                return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      cache_implementation="static", pad_token_id=0)
        generate(2)
        generate(args.new_tokens)  # warm-up of both shapes
        one = median_time(lambda: generate(1), args.repeats)
        full = median_time(lambda: generate(args.new_tokens), args.repeats)
        out = generate(args.new_tokens)[0, len(ids):].tolist()
        rows.append({"engine": "hf-generate (static cache)", "precision": "fp32", "context": length,
                     "ms": 1e3 * (full - one) / (args.new_tokens - 1), "tokens": out})
    return rows


# ---- llama.cpp ------------------------------------------------------------------------------------------------------
def f32_gguf(source: Path, out: Path) -> Path:
    """The GGUF `source` with every tensor dequantized to f32 (gguf's own reader, dequantizer and writer); its
    metadata copied, the file type set to all-F32."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = 0 if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype("float32")
        writer.add_tensor(tensor.name, data.reshape([int(d) for d in reversed(tensor.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def run_llama_cpp(args, contexts: dict[int, list[int]], ggufs: dict[str, Path]) -> list[dict]:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    threads = torch.get_num_threads()
    longest = max(contexts) + args.new_tokens + 16
    rows = []
    variants = [(label, path, None) for label, path in ggufs.items()]
    if "f32" in ggufs:
        variants.append(("f32 + PLD", ggufs["f32"], 7))
    for label, path, draft in variants:
        # logits_all with a draft model: llama-cpp-python 0.3.36 then keeps every position's logits but sizes
        # that buffer by the argument, so without it a prompt-lookup completion fails to store its logits
        model = Llama(model_path=str(path), n_ctx=longest, n_threads=threads, n_threads_batch=threads,
                      n_batch=512, verbose=False, logits_all=bool(draft),
                      draft_model=LlamaPromptLookupDecoding(num_pred_tokens=draft) if draft else None)
        for length, ids in contexts.items():
            def complete(n):
                model.reset()  # no reuse of the previous call's prefix: every call prefills the context
                return model.create_completion(prompt=ids, max_tokens=n, temperature=0.0, top_k=1)
            complete(2)
            complete(args.new_tokens)
            one = median_time(lambda: complete(1), args.repeats)
            full = median_time(lambda: complete(args.new_tokens), args.repeats)
            rows.append({"engine": f"llama.cpp {label}", "precision": label.split()[0], "context": length,
                         "ms": 1e3 * (full - one) / (args.new_tokens - 1)})
        del model
    return rows


# ---- vLLM (its own venv) ---------------------------------------------------------------------------------------------
VLLM_SCRIPT = r"""
import json, statistics, sys, time


def main():  # under the __main__ guard: vLLM's engine core starts in a spawned process that re-imports this file
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    spec = json.load(open(sys.argv[1]))
    llm = LLM(model=spec["model"], dtype="float32", max_model_len=spec["max_len"], enable_prefix_caching=False,
              max_num_seqs=1, seed=0)
    out = []
    for length, ids in spec["contexts"].items():
        def run(n):
            params = SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0, ignore_eos=True)
            return llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        run(2); run(spec["new_tokens"])
        def timed(n):
            times = []
            for _ in range(spec["repeats"]):
                start = time.perf_counter(); run(n); times.append(time.perf_counter() - start)
            return statistics.median(times)
        one, full = timed(1), timed(spec["new_tokens"])
        out.append({"context": int(length), "ms": 1e3 * (full - one) / (spec["new_tokens"] - 1)})
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
"""


def vllm(args, contexts: dict[int, list[int]], model_dir: str) -> list[dict]:
    python = ROOT / ".venv-vllm" / "bin" / "python"
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"model": model_dir, "contexts": {str(k): v for k, v in contexts.items()},
                                    "new_tokens": args.new_tokens, "repeats": args.repeats,
                                    "max_len": max(contexts) + args.new_tokens + 16}))
        script = Path(tmp) / "bench.py"
        script.write_text(VLLM_SCRIPT)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
               "VLLM_CPU_OMP_THREADS_BIND": f"0-{torch.get_num_threads() - 1}", "OMP_NUM_THREADS": str(torch.get_num_threads()),
               "VLLM_CPU_KVCACHE_SPACE": "2"}
        done = subprocess.run([str(python), str(script), str(spec)], capture_output=True, text=True, env=env,
                              timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        lines = (done.stderr or done.stdout).strip().splitlines()
        cause = [line for line in lines if "Error" in line and "Engine core initialization" not in line][-1:]
        raise RuntimeError(f"vLLM exited {done.returncode}: {(cause or lines[-1:] or ['no output'])[0][:300]}")
    return [{"engine": "vllm (CPU)", "precision": "fp32", **row} for row in json.loads(lines[0][7:])]


# ---- the table ------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default")
    parser.add_argument("--gguf", default=None, help="the target's GGUF (default: the embedded target's own)")
    parser.add_argument("--contexts", default="512,2048,4096")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    peers = args.peers.split(",")
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        print(f"error: --peers {','.join(unknown)}: choose from {', '.join(PEERS)}", file=sys.stderr)
        return 2

    from context_cost import copy_bandwidth, kv_bytes_per_token, weight_bytes
    from evalsuite.target import embedded
    from evalsuite.target.model import TargetModel

    target = TargetModel.load(args.target)
    contexts = {int(c): agent_context(target, int(c)) for c in args.contexts.split(",")}
    bandwidth = copy_bandwidth(target.device)
    weights, per_token = weight_bytes(target), kv_bytes_per_token(target)
    model_dir = target.model_dir
    del target
    print(f"target {args.target} ({model_dir.split('/')[-1]}), {torch.get_num_threads()} threads, "
          f"{args.new_tokens} new tokens after each context, {args.repeats} repeats (medians); weights "
          f"{weights / 1e6:.0f} MB, KV {per_token / 1e3:.1f} kB/token, copy bandwidth {bandwidth / 1e9:.1f} GB/s "
          "(measured now)", flush=True)

    rows, skipped = [], []
    for peer in peers:
        try:
            if peer == "ours":
                rows += ours(args, contexts)
            elif peer == "hf-generate":
                rows += hf_generate(args, contexts, model_dir)
            elif peer == "llama-cpp":
                try:
                    import llama_cpp  # noqa: F401
                except ImportError:
                    skipped.append("llama-cpp: llama-cpp-python is not installed (scripts/setup.sh --all)")
                    continue
                entry = embedded.lookup(args.target)
                source = Path(args.gguf) if args.gguf else (embedded.gguf_file(entry)[0] if entry else None)
                if source is None or not source.exists():
                    skipped.append(f"llama-cpp: no GGUF for --target {args.target} (pass --gguf)")
                    continue
                quant = source.stem.split(".")[-1].split("-")[-1]
                f32 = embedded.cache_root() / "gguf" / f"{source.stem}.f32.gguf"
                if not f32.exists():
                    f32.parent.mkdir(parents=True, exist_ok=True)
                    f32_gguf(source, f32.with_suffix(".tmp"))
                    f32.with_suffix(".tmp").replace(f32)
                rows += run_llama_cpp(args, contexts, {"f32": f32, quant: source})
            elif peer == "vllm":
                if not (ROOT / ".venv-vllm" / "bin" / "python").exists():
                    skipped.append("vllm: no .venv-vllm (scripts/setup_vllm.sh)")
                    continue
                rows += vllm(args, contexts, model_dir)
        except Exception as err:  # a peer that fails is reported, never silently dropped
            if os.environ.get("EVALSUITE_DEBUG"):
                raise
            skipped.append(f"{peer}: failed ({type(err).__name__}: {str(err).splitlines()[0][:160]})")
        print(f"  {peer}: done", flush=True)

    print(f"{'engine':30s} {'precision':>9s} {'context':>7s} {'ms/token':>9s} {'÷ floor':>8s} {'τ':>5s} "
          f"{'× ours ar':>9s}")
    for length in contexts:
        floor = 1e3 * (weights + per_token * length) / bandwidth
        ours_ar = next((r["ms"] for r in rows if r["engine"] == "ours ar" and r["context"] == length), None)
        for row in [r for r in rows if r["context"] == length]:
            ratio = f"{row['ms'] / ours_ar:9.2f}" if ours_ar else f"{'-':>9s}"
            tau = f"{row['tau']:5.2f}" if row.get("tau") else f"{'-':>5s}"
            print(f"{row['engine']:30s} {row['precision']:>9s} {length:7d} {row['ms']:9.2f} "
                  f"{row['ms'] / floor:8.2f} {tau} {ratio}")
    def agree(length: int) -> bool:  # the same greedy tokens, up to an EOS of ours (generate is held from EOS)
        a = next(r["tokens"] for r in rows if r["engine"] == "ours ar" and r["context"] == length)
        b = next(r["tokens"] for r in rows if r["engine"].startswith("hf-gen") and r["context"] == length)
        n = min(16, len(a) - (len(a) < args.new_tokens))
        return a[:n] == b[:n]
    if {"ours ar", "hf-generate (static cache)"} <= {r["engine"] for r in rows}:
        same = [length for length in contexts if agree(length)]
        print(f"ours ar and hf-generate write the same greedy tokens (up to 16) at contexts {same} of "
              f"{list(contexts)}")
    for line in skipped:
        print(f"skipped {line}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": [{k: v for k, v in r.items() if k != "tokens"} for r in rows],
                                               "skipped": skipped}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
