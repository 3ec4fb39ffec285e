"""Our engine beside the engines a user would pick instead, in one run: same target, same prompt, same context
lengths, same machine, same thread count.

Rows (each a decode of `--new-tokens` greedy tokens after a context of each length; ms per new token, prefill
excluded; ÷ floor = ms ÷ (weight bytes + KV bytes at that context) / copy bandwidth (read + write) measured now,
÷ read the same over the read bandwidth (a sum over a large tensor), the stricter floor):
- `ours ar` / `ours ngram`: evalsuite's engine (`HfEngine`, the default fused decoder), a plain decode and our
  n-gram prompt lookup (k=7), plus `ours verify-8`: one 8-token verify forward, and `ours weight products`: the
  one-row products of a decode over the same weights, on the kernels our decode uses (MKL, oneDNN or evalsuite's
  panels, as `--weight-layout auto` chose), and nothing else (what the rest of our forward costs is `ours ar`
  minus this row; what our product kernel costs against llama.cpp's is this row against its f32);
- `ours --compile ar` / `ngram` / `verify-8` (peer `ours-compile`): the same engine with `--compile`, its one-token
  decodes through torch.compile (compiled in the warm-up);
- `hf-generate`: transformers' `generate` with its static cache (`cache_implementation="static"`), eager, fp32;
- `llama.cpp f32` / `llama.cpp <quant>`: llama-cpp-python on a GGUF of the same weights, f32 (dequantized from
  the shipped GGUF, so the same values as ours) and the shipped quantisation (the speed a CPU user actually gets),
  plus `llama.cpp f32 + PLD`: its prompt-lookup speculative decoding (7 draft tokens) beside our ngram;
- `vllm`: vLLM's CPU engine from `.venv-vllm` (fp32, prefix caching off), run as a subprocess after the others,
  and `ours ar (after vllm)` re-timed right after it: vLLM's "× ours ar" is against that row.
A peer that is not installed, or has nothing to load, is skipped with its reason printed; nothing is dropped.

The prompt: a real agent context (a bundled SWE-Bench trajectory rendered through the target's chat template),
its last N tokens for each context length N, so that prompt lookup has what an agent context offers.

    python benchmarks/engines.py [--target default] [--contexts 512,2048,4096] [--new-tokens 64] [--repeats 3]
        [--peers ours,ours-compile,hf-generate,llama-cpp,vllm] [--threads N]
Timing: every in-process engine is loaded first and warmed up on each context's shapes; then each repeat times
every engine once, in turn (this VM's speed drifts by tens of percent within minutes, so engines timed one after
another are not comparable); medians are printed.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
PEERS = ("ours", "ours-compile", "hf-generate", "llama-cpp", "vllm")


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


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_time(fn, repeats: int) -> float:
    return statistics.median(seconds(fn) for _ in range(repeats))


@dataclass
class Timer:
    """One row of the table per context: `warm(length)` runs its shapes untimed, `sample(length)` times one
    repeat and returns ms per new token; `info` collects what a row carries besides its time (τ, tokens)."""

    engine: str
    precision: str
    warm: Callable[[int], None]
    sample: Callable[[int], float]
    info: dict = field(default_factory=dict)  # context → extra row fields


def decode_difference(run: Callable[[int], int], new_tokens: int) -> float:
    """ms per new token of a peer that prefills inside its own call: `run(n)` asks for n tokens and returns how
    many it wrote; (time of the n-token call − time of the 1-token call) ÷ (tokens written − tokens written by the
    1-token call), so the prefill cancels and a call that wrote fewer tokens than asked is still divided right."""
    start = time.perf_counter()
    wrote_one = run(1)
    middle = time.perf_counter()
    wrote = run(new_tokens)
    end = time.perf_counter()
    if wrote - wrote_one < 1:
        raise RuntimeError(f"asked for {new_tokens} tokens, wrote {wrote}: nothing to time")
    return 1e3 * ((end - middle) - (middle - start)) / (wrote - wrote_one)


def failure(what: str, err: Exception) -> str:
    """The one line a failed peer leaves in the table's `skipped` list (EVALSUITE_DEBUG=1: the traceback)."""
    if os.environ.get("EVALSUITE_DEBUG"):
        raise err
    first = (str(err).splitlines() or [""])[0]
    return f"{what}: failed ({type(err).__name__}: {first[:160]})"


def read_bandwidth(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second read by a sum over a large, written (so resident) tensor: the pace of a weight read,
    which a decode needs; the copy floor counts a write as well."""
    data = torch.ones(megabytes << 18, device=device)
    data.sum()
    return data.nbytes / median_time(lambda: float(data.sum()), repeats)


# ---- ours ---------------------------------------------------------------------------------------------------------
class Ours:
    """evalsuite's engine: `ar` and `ngram` decodes, one 8-token verify forward, and the weight products of one
    decode alone, on the kernels the engine's decode uses (`FusedDecoder._linear` with its prepared weights: what
    the rest of the forward adds is the difference between that row and `ours ar`)."""

    def __init__(self, args, contexts: dict[int, list[int]], compile: bool = False):
        from evalsuite.config import RunConfig
        from evalsuite.engines.hf import HfEngine

        config = RunConfig(methods=["ngram"], task="swebench", target=args.target, max_new_tokens=args.new_tokens,
                           k=7, threads=torch.get_num_threads(), compile=compile)
        label = "ours --compile" if compile else "ours"
        self.engine = HfEngine(config)
        self.engine.start(["ar", "ngram"], torch.get_num_threads())
        self.contexts = contexts
        self.current = self.warmed = None
        target = self.engine.target
        fused = target.fused
        if fused is None:
            self.weights = [(m.weight, None) for m in target.model.modules() if isinstance(m, torch.nn.Linear)]
        else:
            self.weights = [(getattr(layer, name), (layer.packed or {}).get(name)) for layer in fused.layers
                            for name in ("qkv", "o", "gate_up", "down")]
            self.weights.append((fused.head, fused.head_packed))
        self.product = (lambda x, w, packed: F.linear(x, w)) if fused is None else \
            (lambda x, w, packed: fused._linear(x.view(1, 1, -1), w, packed))
        self.rows = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device) for w, _ in self.weights}
        self.timers = [Timer(f"{label} {m}", "fp32", self._warm, self._decoder(m, info), info)
                       for m, info in (("ar", {}), ("ngram", {}))]
        self.timers += [Timer(f"{label} verify-8", "fp32", self._warm, self._verify)]
        if not compile:  # the same weights either way
            self.timers += [Timer("ours weight products", "fp32", self._warm, self._products)]

    def _at(self, length: int) -> list[int]:
        if self.current != length:  # one trajectory per context: the prefix cache then holds it
            self.engine.begin_trajectory()
            self.current = length
        return self.contexts[length]

    def _warm(self, length: int) -> None:
        """Every shape of this context, untimed, once (the four rows share it)."""
        if self.warmed == length:
            return
        ids = self._at(length)
        for method in ("ar", "ngram"):
            self.engine.decode(method, ids, 0)
        self._verify(length)
        self._products(length)
        self.warmed = length

    def ar_again(self, length: int, repeats: int) -> float:
        """Our `ar` at `length` warmed up and timed anew (after another engine has had the machine)."""
        self.warmed = None
        self._warm(length)
        return statistics.median(self.timers[0].sample(length) for _ in range(repeats))

    def _decoder(self, method: str, info: dict) -> Callable[[int], float]:
        from evalsuite.metrics import tau_of

        def sample(length: int) -> float:
            result = self.engine.decode(method, self._at(length), 0)
            steps = result.steps
            tau = tau_of([s.num_accepted for s in steps], [s.budget_limited for s in steps])
            info[length] = {"tau": round(tau, 2) if method != "ar" else None, "tokens": result.output_ids}
            return 1e3 * result.decode_s / len(result.output_ids)
        return sample

    def _verify(self, length: int) -> float:
        ids = self._at(length)
        self.engine.prefix.prefill(ids)
        cache, target = self.engine.prefix.cache, self.engine.target
        block = torch.tensor(ids[-8:], dtype=torch.long)

        def verify():
            target.forward(block, cache)
            cache.crop_to(len(ids))
        return 1e3 * median_time(verify, 5)

    def _products(self, length: int) -> float:
        def products():
            with torch.inference_mode():
                for w, packed in self.weights:
                    self.product(self.rows[w.shape[1]], w, packed)
        return 1e3 * median_time(products, 5)

    def close(self) -> None:
        self.engine.close()


# ---- transformers' generate with a static cache ---------------------------------------------------------------------
def hf_generate(args, contexts: dict[int, list[int]], model_dir: str) -> list[Timer]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def generate(length: int, n: int):
        with torch.inference_mode():
            return model.generate(torch.tensor([contexts[length]]), max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, cache_implementation="static", pad_token_id=0)

    tokens = {}

    def warm(length: int) -> None:
        generate(length, 2)
        out = generate(length, args.new_tokens)  # warm-up of both shapes; greedy, so these are its tokens
        tokens[length] = {"tokens": out[0, len(contexts[length]):].tolist()}

    def sample(length: int) -> float:
        return decode_difference(lambda n: generate(length, n).shape[1] - len(contexts[length]), args.new_tokens)

    return [Timer("hf-generate (static cache)", "fp32", warm, sample, tokens)]


# ---- llama.cpp ------------------------------------------------------------------------------------------------------
def f32_gguf(source: Path, out: Path) -> Path:
    """The GGUF `source` with every tensor dequantized to f32 (gguf's own reader, dequantizer and writer); its
    metadata copied, the file type set to all-F32."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for field_ in reader.fields.values():
        if field_.name == gguf.Keys.General.ARCHITECTURE or field_.name.startswith("GGUF."):
            continue
        value = 0 if field_.name == gguf.Keys.General.FILE_TYPE else field_.contents()
        kind = field_.types[0]
        sub = field_.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field_.name, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype("float32")
        writer.add_tensor(tensor.name, data.reshape([int(d) for d in reversed(tensor.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def run_llama_cpp(args, contexts: dict[int, list[int]], ggufs: dict[str, Path]) -> list[Timer]:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    threads = torch.get_num_threads()
    longest = max(contexts) + args.new_tokens + 16
    variants = [(label, path, None) for label, path in ggufs.items()]
    if "f32" in ggufs:
        variants.append(("f32 + PLD", ggufs["f32"], 7))
    timers = []
    for label, path, draft in variants:
        # logits_all with a draft model: llama-cpp-python 0.3.36 then keeps every position's logits but sizes
        # that buffer by the argument, so without it a prompt-lookup completion fails to store its logits
        model = Llama(model_path=str(path), n_ctx=longest, n_threads=threads, n_threads_batch=threads,
                      n_batch=512, verbose=False, logits_all=bool(draft),
                      draft_model=LlamaPromptLookupDecoding(num_pred_tokens=draft) if draft else None)

        def complete(length: int, n: int, model=model) -> int:
            """n greedy tokens after the context (EOS banned, as generate's min_new_tokens does: llama.cpp would
            stop at it, and a 64-token call that stopped after 30 was timed as if it had written 64); returns how
            many it wrote. Without a `reset()` first, llama-cpp-python reuses the context already in its cache
            and evaluates only its last token again."""
            out = model.create_completion(prompt=contexts[length], max_tokens=n, temperature=0.0, top_k=1,
                                          logit_bias={model.token_eos(): float("-inf")})
            return int(out["usage"]["completion_tokens"])

        def warm(length: int, model=model, complete=complete) -> None:
            model.reset()
            complete(length, 1)  # the prefill, once per context
            complete(length, args.new_tokens)

        def sample(length: int, complete=complete) -> float:
            """n tokens decoded over the cached context: n forwards (its last context token again, then n − 1 new
            ones) for n tokens, and no prefill to subtract (a 4k-token prefill is 15-20 s here, so its noise
            would swamp a difference of two calls)."""
            start = time.perf_counter()
            wrote = complete(length, args.new_tokens)
            return 1e3 * (time.perf_counter() - start) / wrote

        timers.append(Timer(f"llama.cpp {label}", label.split()[0], warm, sample))
    return timers


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
        threads = torch.get_num_threads()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
               "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "OMP_NUM_THREADS": str(threads),
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
    bandwidth, reads = copy_bandwidth(target.device), read_bandwidth(target.device)
    weights, per_token = weight_bytes(target), kv_bytes_per_token(target)
    model_dir = target.model_dir
    del target
    print(f"target {args.target} ({model_dir.split('/')[-1]}), {torch.get_num_threads()} threads, "
          f"{args.new_tokens} new tokens after each context, {args.repeats} repeats (medians); weights "
          f"{weights / 1e6:.0f} MB, KV {per_token / 1e3:.1f} kB/token, copy bandwidth {bandwidth / 1e9:.1f} GB/s "
          f"(read + write), read bandwidth {reads / 1e9:.1f} GB/s (measured now)", flush=True)

    rows, skipped, timers, mine, closing = [], [], [], None, []
    for peer in [p for p in peers if p != "vllm"]:  # in-process peers: set up all, then time them interleaved
        try:
            if peer == "ours":
                mine = Ours(args, contexts)
                timers += mine.timers
                closing.append(mine)
            elif peer == "ours-compile":  # --compile: the fused decoder's one-token decodes through torch.compile
                compiled = Ours(args, contexts, compile=True)
                timers += compiled.timers
                closing.append(compiled)
            elif peer == "hf-generate":
                timers += hf_generate(args, contexts, model_dir)
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
                timers += run_llama_cpp(args, contexts, {"f32": f32, quant: source})
        except Exception as err:  # a peer that fails is reported, never silently dropped
            skipped.append(failure(peer, err))
        print(f"  {peer}: loaded", flush=True)

    # every repeat times every engine once, in turn, so that this machine's drift hits all of them alike
    for length in contexts:
        times: dict[str, list[float]] = {}
        for timer in list(timers):
            try:
                timer.warm(length)
                times[timer.engine] = []
            except Exception as err:
                skipped.append(failure(f"{timer.engine} at {length}", err))
        for _ in range(args.repeats):
            for timer in timers:
                if timer.engine in times:
                    times[timer.engine].append(timer.sample(length))
        for timer in timers:
            if times.get(timer.engine):
                rows.append({"engine": timer.engine, "precision": timer.precision, "context": length,
                             "ms": statistics.median(times[timer.engine]), **timer.info.get(length, {})})
        print(f"  context {length}: timed", flush=True)

    if "vllm" in peers:  # its own venv and process: timed apart, with our ar re-timed right after it
        try:
            if not (ROOT / ".venv-vllm" / "bin" / "python").exists():
                skipped.append("vllm: no .venv-vllm (scripts/setup_vllm.sh)")
            else:
                rows += vllm(args, contexts, model_dir)
                if mine is not None:
                    rows += [{"engine": "ours ar (after vllm)", "precision": "fp32", "context": length,
                              "ms": mine.ar_again(length, args.repeats)} for length in contexts]
        except Exception as err:
            skipped.append(failure("vllm", err))
        print("  vllm: done", flush=True)
    for engine in closing:
        engine.close()

    print(f"{'engine':30s} {'precision':>9s} {'context':>7s} {'ms/token':>9s} {'÷ floor':>8s} {'÷ read':>7s} "
          f"{'τ':>5s} {'× ours ar':>9s}")
    for length in contexts:
        floor = 1e3 * (weights + per_token * length) / bandwidth
        read_floor = 1e3 * (weights + per_token * length) / reads
        def ours(name: str):
            return next((r["ms"] for r in rows if r["engine"] == name and r["context"] == length), None)
        for row in [r for r in rows if r["context"] == length]:
            ours_ar = ours("ours ar (after vllm)" if row["engine"].startswith("vllm") else "ours ar")
            ratio = f"{row['ms'] / ours_ar:9.2f}" if ours_ar else f"{'-':>9s}"
            tau = f"{row['tau']:5.2f}" if row.get("tau") else f"{'-':>5s}"
            print(f"{row['engine']:30s} {row['precision']:>9s} {length:7d} {row['ms']:9.2f} "
                  f"{row['ms'] / floor:8.2f} {row['ms'] / read_floor:7.2f} {tau} {ratio}")
    def agree(length: int) -> bool:  # the same greedy tokens, up to an EOS of ours (generate is held from EOS)
        a = next(r["tokens"] for r in rows if r["engine"] == "ours ar" and r["context"] == length)
        b = next(r["tokens"] for r in rows if r["engine"].startswith("hf-gen") and r["context"] == length)
        n = min(16, len(a) - (len(a) < args.new_tokens))
        return a[:n] == b[:n]
    if {"ours ar", "hf-generate (static cache)"} <= {r["engine"] for r in rows}:
        same = [length for length in contexts if agree(length)]
        print(f"ours ar and hf-generate write the same greedy tokens (up to 16) at contexts {same} of "
              f"{list(contexts)}")
    if {"ours ar", "ours --compile ar"} <= {r["engine"] for r in rows}:
        def tokens(engine: str, length: int) -> list[int]:
            return next(r["tokens"] for r in rows if r["engine"] == engine and r["context"] == length)
        same = [length for length in contexts if tokens("ours ar", length) == tokens("ours --compile ar", length)]
        print(f"ours ar and ours --compile ar write the same tokens at contexts {same} of {list(contexts)}")
    for line in skipped:
        print(f"skipped {line}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": [{k: v for k, v in r.items() if k != "tokens"} for r in rows],
                                               "skipped": skipped}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
