"""The vLLM side of `evalsuite run --engine vllm`: one offline `vllm.LLM` engine, driven over JSON lines.

Run by evalsuite with the vLLM venv's python (`python vllm_worker.py CONFIG_JSON`); it imports nothing of
evalsuite but the torch-free `vllm_steps`. Protocol: after start-up it writes one `{"ready": ...}` line,
then answers each request line `{"prompt_ids": [...], "max_tokens": n, "seed": s}` with one result line,
until stdin closes. Lines `{"op": "add", "id": ..., ...}` instead join the requests in flight, which the
engine steps together (continuous batching, up to `max_num_seqs`); each is answered by a `{"op": "done"}`
line when it finishes, and `{"op": "reset"}` empties the prefix cache between measurements (`evalsuite
concurrency`). Protocol lines go to the original stdout; everything vLLM prints goes to stderr.

CPU workarounds (see scripts/setup_vllm.sh for the first): the KV cache is sized by VLLM_CPU_KVCACHE_SPACE
rather than gpu_memory_utilization, the entry point is guarded (the engine core is spawned), and the
`vllm` console script is never used.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def speculative_config(cfg: dict) -> dict | None:
    """vLLM's `speculative_config`, as evalsuite's engine built it from the method's declaration (None: no
    speculation, the `ar` baseline)."""
    spec = cfg.get("speculative")
    return dict(spec) if spec else None


def main() -> None:
    cfg = json.loads(sys.argv[1])
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM logs to stdout: send all of it to stderr (the log file)
    if cfg.get("device", "cpu") == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.get("kv_cache_gib", 1)))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import numpy as np
    import vllm
    from vllm import LLM, SamplingParams

    from vllm_steps import rebuild_steps

    spec = speculative_config(cfg)
    engine_args = dict(
        model=cfg["model"], tokenizer=cfg["model"], dtype=cfg.get("dtype", "float32"), seed=int(cfg["seed"]),
        max_model_len=int(cfg["max_model_len"]), enforce_eager=bool(cfg["enforce_eager"]),
        enable_prefix_caching=True, disable_log_stats=False, speculative_config=spec,
        max_num_seqs=int(cfg.get("max_num_seqs", 4)),
    )
    if spec is not None:  # vLLM refuses the option without speculation
        engine_args["per_request_spec_decode_metrics"] = "detailed"
    if cfg.get("device", "cpu") != "cpu":
        engine_args["gpu_memory_utilization"] = float(cfg.get("gpu_memory_utilization", 0.5))
    started = time.perf_counter()
    llm = LLM(**engine_args)
    ready = {"ready": True, "vllm_version": vllm.__version__, "startup_s": time.perf_counter() - started,
             "engine_args": {k: v for k, v in engine_args.items() if k not in ("model", "tokenizer")}}
    proto.write(json.dumps(ready) + "\n")

    would_draft_ngram = None
    if spec is not None and spec["method"] == "ngram":
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as lookup

        def would_draft_ngram(ids: list[int]) -> bool:  # vLLM's own n-gram proposer, as its scheduler calls it
            found = lookup(np.asarray(ids, dtype=np.int32), int(spec["prompt_lookup_min"]),
                           int(spec["prompt_lookup_max"]),
                           int(cfg["max_model_len"]), int(cfg["k"]))
            return len(found) > 0

    def sampling(req: dict) -> SamplingParams:
        return SamplingParams(
            temperature=float(cfg["temperature"]), top_p=float(cfg["top_p"]),
            top_k=int(cfg["top_k"]) if int(cfg["top_k"]) > 0 else 0, max_tokens=int(req["max_tokens"]),
            seed=int(req["seed"]), stop_token_ids=list(cfg["stop_ids"]), detokenize=False,
        )

    def result_of(out, prompt: list[int], wall: float) -> dict:
        completion = out.outputs[0]
        ids = list(completion.token_ids)
        m = out.metrics
        timing = None
        if m is not None and getattr(m, "first_token_ts", 0) and getattr(m, "last_token_ts", 0):
            timing = {"scheduled_ts": m.scheduled_ts, "first_token_ts": m.first_token_ts,
                      "last_token_ts": m.last_token_ts, "queued_ts": m.queued_ts}
        sd = completion.spec_decode_metrics.to_dict() if getattr(completion, "spec_decode_metrics", None) else {}
        accepted, drafted = list(sd.get("per_step_accepted", [])), list(sd.get("per_step_drafted", []))
        oracle = (lambda pos: would_draft_ngram(prompt + ids[:pos])) if would_draft_ngram else None
        steps, exact = rebuild_steps(len(prompt), len(ids), accepted, drafted, oracle) if spec else \
            rebuild_steps(len(prompt), len(ids), [], [])
        return {"output_ids": ids, "finish_reason": completion.finish_reason, "wall_s": wall,
                "num_cached_tokens": out.num_cached_tokens, "timing": timing, "spec_decode": sd,
                "steps": steps, "steps_exact": exact}

    # Two kinds of request line: {"prompt_ids", "max_tokens", "seed"} is decoded alone and answered at once (the
    # runner's turn by turn); {"op": "add", "id", ...} joins the requests in flight, which the engine steps
    # together, each answered {"op": "done", "id", ...} when it finishes (`evalsuite concurrency`).
    reader = LineReader(sys.stdin.fileno())
    in_flight: dict[str, tuple[float, list[int]]] = {}
    engine = llm.llm_engine
    while True:
        lines = reader.ready(block=not in_flight)
        if lines is None and not in_flight:
            break
        for line in lines or []:
            req = json.loads(line)
            if req.get("op") == "reset":  # between measurements: no request may find another's prefix cached
                ok = bool(llm.reset_prefix_cache()) if not in_flight else False
                proto.write(json.dumps({"op": "reset", "ok": ok}) + "\n")
                continue
            if req.get("op") == "add":
                prompt = list(req["prompt_ids"])
                in_flight[str(req["id"])] = (time.perf_counter(), prompt)
                engine.add_request(str(req["id"]), {"prompt_token_ids": prompt}, sampling(req))
                continue
            t0 = time.perf_counter()
            out = llm.generate([{"prompt_token_ids": req["prompt_ids"]}], sampling(req), use_tqdm=False)[0]
            proto.write(json.dumps(result_of(out, req["prompt_ids"], time.perf_counter() - t0)) + "\n")
        if in_flight:
            for out in engine.step():
                if out.finished and out.request_id in in_flight:
                    added, prompt = in_flight.pop(out.request_id)
                    done = time.perf_counter()
                    proto.write(json.dumps({"op": "done", "id": out.request_id, "added": added, "done": done,
                                            **result_of(out, prompt, done - added)}) + "\n")


class LineReader:
    """Whole lines from a file descriptor, without blocking when asked not to (a text-mode file's own buffer would
    hide lines from `select`)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = b""
        self.closed = False

    def ready(self, block: bool) -> list[str] | None:
        """The complete lines available now (waiting for one when `block`); None once the input is closed and
        drained."""
        import select

        while True:
            if b"\n" in self.buffer:
                *lines, self.buffer = self.buffer.split(b"\n")
                return [x.decode() for x in lines if x.strip()]
            if self.closed:
                return None
            readable, _, _ = select.select([self.fd], [], [], None if block else 0)
            if not readable:
                return []
            chunk = os.read(self.fd, 1 << 16)
            if chunk:
                self.buffer += chunk
                continue
            self.closed = True
            if self.buffer.strip():
                self.buffer += b"\n"


if __name__ == "__main__":  # required: vLLM spawns its engine core, which re-imports this module
    main()
