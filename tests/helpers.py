"""Shared test helpers, in one module: synthetic released-format checkpoints of the block drafters (DLite, DFlash,
DSpark), one-turn decoding with test methods (random, oracle), the draft-cache rebuild check, hand-built run
directories with known values for the report, and reading a run's tables.

The synthetic checkpoints spell out the released config.json keys and safetensors key names and shapes
independently of the implementation (docs/methods.md §1.2, §3.2, §4.2), scaled down to the tiny targets. Weights are
random, stored in bfloat16 like the releases, large enough that the drafters' outputs are far from uniform.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import save_file

from evalsuite import degenerate
from evalsuite.engines.hf import PrefixCache
from evalsuite.engines.loop import decode_turn
from evalsuite.methods.base import Method, Proposal, Sampling
from evalsuite.store.records import StepRecord, TurnRecord
from evalsuite.store.run_store import RunStore, read_run
from evalsuite.target.model import TargetModel
from evalsuite.timing import DeviceClock

# Method layer sizes deliberately unlike the tiny target's (4 heads / 2 KV / head_dim 16): the drafter's
# attention shape must come from its own config.
HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, LAYERS = 2, 1, 24, 96, 2


def qwen3_fields(target, layers: int = LAYERS) -> dict:
    """Standard Qwen3 keys of a released drafter config, sized for `target`."""
    return {
        "model_type": "qwen3", "hidden_size": target.hidden_size, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "rope_scaling": None, "max_position_embeddings": 40960, "vocab_size": target.vocab_size,
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "layer_types": ["full_attention"] * layers, "use_cache": True,
    }


def layer_shapes(target, layers: int = LAYERS) -> dict[str, tuple[int, ...]]:
    h = target.hidden_size
    shapes = {}
    for i in range(layers):
        p = f"layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, h), p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, h),
            p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, h), p + "self_attn.o_proj.weight": (h, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,),
            p + "mlp.gate_proj.weight": (INTERMEDIATE, h), p + "mlp.up_proj.weight": (INTERMEDIATE, h),
            p + "mlp.down_proj.weight": (h, INTERMEDIATE),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        }
    return shapes | {"norm.weight": (h,)}


def write_checkpoint(directory: Path, config: dict, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        if len(shape) == 1 and name.endswith(".bias"):
            value = torch.randn(shape, generator=generator) * 0.1
        elif len(shape) == 1:  # norm weights
            value = 0.5 + torch.rand(shape, generator=generator)
        else:
            value = torch.randn(shape, generator=generator) * 0.3
        tensors[name] = value.to(torch.bfloat16)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def zlab_checkpoint(directory, target, layer_ids=(0, 1, 2), block_size: int = 16, mask_token_id: int = 3) -> Path:
    """`z-lab/Qwen3-*-DFlash-b16` format."""
    config = qwen3_fields(target) | {
        "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": block_size, "num_target_layers": target.num_layers,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids)},
    }
    h = target.hidden_size
    shapes = layer_shapes(target) | {"fc.weight": (h, len(layer_ids) * h), "hidden_norm.weight": (h,)}
    return write_checkpoint(directory, config, shapes)


def deepspec_checkpoint(directory, target, layer_ids=(0, 1, 2), block_size: int = 7, markov_rank: int = 16,
                        markov_head_type: str = "vanilla", confidence: bool = True, with_markov: bool = True,
                        own_embed_head: bool = True, mask_token_id: int = 3) -> Path:
    """`deepseek-ai/dspark_qwen3_*_block7` format; `markov_rank=0, confidence=False` is `dflash_qwen3_*_block7`."""
    config = qwen3_fields(target) | {
        "architectures": ["Qwen3DSparkModel"], "num_target_layers": target.num_layers, "block_size": block_size,
        "mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids), "num_anchors": 512,
        "enable_confidence_head": confidence, "markov_rank": markov_rank,
    }
    if markov_rank:
        config["markov_head_type"] = markov_head_type
    if confidence:
        config["confidence_head_with_markov"] = with_markov
    h, v, r = target.hidden_size, target.vocab_size, markov_rank
    shapes = layer_shapes(target) | {"fc.weight": (h, len(layer_ids) * h), "hidden_norm.weight": (h,)}
    if own_embed_head:
        shapes |= {"embed_tokens.weight": (v, h), "lm_head.weight": (v, h)}
    if r:
        shapes |= {"markov_head.markov_w1.weight": (v, r), "markov_head.markov_w2.weight": (v, r)}
        if markov_head_type == "gated":
            shapes |= {"markov_head.gate_proj.weight": (r, h + r), "markov_head.gate_proj.bias": (r,)}
        if markov_head_type == "rnn":
            shapes |= {"markov_head.joint_proj.weight": (3 * r, 2 * r + h), "markov_head.joint_proj.bias": (3 * r,)}
    if confidence:
        shapes |= {"confidence_head.proj.weight": (1, h + (r if with_markov else 0)), "confidence_head.proj.bias": (1,)}
    return write_checkpoint(directory, config, shapes)


def dlite_checkpoint(directory, target, layer_ids=(0, 1, 2, 3), anchor_group_size: int = 1, block_size: int = 8,
                     rank: int = 16, mask_token_id: int = 3, **dlite_overrides) -> Path:
    """`SJTU-DAI-Sys/Qwen3-*-DLite` format (a Qwen3 config with `dlite_config`)."""
    dlite_config = {
        "architecture_version": "dlite_v1", "model_role": "pivot_q_student", "anchor_group_size": anchor_group_size,
        "chs_num_layers": len(layer_ids), "target_layer_ids": list(layer_ids), "sequential_head": "rnn",
        "sequential_rank": rank, "mask_token_id": mask_token_id,
    } | dlite_overrides
    config = qwen3_fields(target) | {"architectures": ["DLiteDraftModel"], "block_size": block_size,
                                     "num_target_layers": target.num_layers, "dlite_config": dlite_config}
    h, v = target.hidden_size, target.vocab_size
    shapes = layer_shapes(target) | {
        "layer_depth_embedding.weight": (target.num_layers, h), "context_norm.weight": (h,),
        "sequential_head.prev_token_embedding.weight": (v, rank), "sequential_head.output_proj.weight": (v, rank),
        "sequential_head.state_proj.weight": (2 * rank, 2 * rank), "sequential_head.state_proj.bias": (2 * rank,),
        "sequential_head.state_hidden_mlp.weight": (rank, rank + h), "sequential_head.state_hidden_mlp.bias": (rank,),
    }
    return write_checkpoint(directory, config, shapes)


PROMPT = [1, 40, 41, 42, 43, 40, 41, 42, 100, 7, 7, 9, 100, 7, 55, 56, 57, 58, 200, 201]


def assert_cache_matches_rebuild(drafter, target, prompt: list[int], max_new: int, k: int) -> int:
    """Decode a turn; at every step also rebuild the draft cache from scratch (a fresh copy of the drafter fed
    the whole context so far) and check that its block outputs equal the incremental drafter's.
    Returns the number of steps checked."""
    history: dict = {}
    start_turn, commit, block_outputs = drafter.start_turn, drafter.commit, drafter.block_outputs
    checked = []

    def spy_start(ids, features):
        history["ids"], history["features"] = ids.clone(), features.clone()
        start_turn(ids, features)

    def spy_commit(new_ids, new_features):
        history["ids"] = torch.cat([history["ids"], new_ids])
        history["features"] = torch.cat([history["features"], new_features])
        commit(new_ids, new_features)

    def spy_block():
        incremental = block_outputs()
        fresh = copy.copy(drafter)
        fresh.cache = type(drafter.cache)(drafter.cache.num_layers)
        type(drafter).start_turn(fresh, history["ids"], history["features"])
        rebuilt = type(drafter).block_outputs(fresh)
        torch.testing.assert_close(incremental, rebuilt, rtol=1e-4, atol=1e-4)
        checked.append(drafter.cache.length)
        return incremental

    drafter.start_turn, drafter.commit, drafter.block_outputs = spy_start, spy_commit, spy_block
    try:
        decode(target, drafter, prompt, max_new, k)
    finally:
        del drafter.start_turn, drafter.commit, drafter.block_outputs
    assert checked == sorted(checked) and len(checked) > 10
    return len(checked)


def scripted_commits(drafter, steps: list[int], hidden_size: int, seed: int = 0) -> None:
    """Drive propose-side forwards with commits of chosen sizes (as after rejections at different places) and
    compare each block output with a from-scratch rebuild."""
    generator = torch.Generator().manual_seed(seed)
    layers = len(drafter.feature_layers)
    total = 12 + sum(steps)
    ids = torch.randint(4, 200, (total + 1,), generator=generator)
    features = torch.randn(total, layers, hidden_size, generator=generator)
    n = 12
    drafter.start_turn(ids[: n + 1], features[:n])
    for m in [0] + steps:
        if m:
            drafter.commit(ids[n + 1: n + m + 1], features[n: n + m])
            n += m
        incremental = drafter.block_outputs()
        fresh = copy.copy(drafter)
        fresh.cache = type(drafter.cache)(drafter.cache.num_layers)
        fresh.start_turn(ids[: n + 1], features[:n])
        torch.testing.assert_close(incremental, fresh.block_outputs(), rtol=1e-4, atol=1e-4)
        assert drafter.cache.length == n


# ---- one-turn decoding with test methods ------------------------------------------------------------------------
class RandomMethod(Method):
    """A deliberately bad drafter: uniform random tokens, with their true (uniform) proposal distribution."""

    name = "random"

    def __init__(self, vocab_size: int, seed: int = 123):
        self.vocab_size = vocab_size
        self.rng = torch.Generator().manual_seed(seed)

    def propose(self, k, sampling, generator):
        tokens = torch.randint(0, self.vocab_size, (k,), generator=self.rng)
        probs = torch.full((k, self.vocab_size), 1.0 / self.vocab_size)
        return Proposal(tokens=tokens, probs=probs)


class OracleMethod(Method):
    """Proposes a fixed future token sequence: lets a test choose exactly where rejections happen."""

    name = "oracle"

    def __init__(self, future: list[int]):
        self.future = future
        self.position = 0

    def start_turn(self, ids, features):
        self.position = 1  # the anchor is future[0]

    def propose(self, k, sampling, generator):
        return Proposal(tokens=torch.tensor(self.future[self.position: self.position + k], dtype=torch.long))

    def commit(self, new_ids, new_features):
        self.position += new_ids.numel()


def decode(target: TargetModel, drafter: Method, prompt: list[int], max_new: int, k: int = 4,
           sampling: Sampling = Sampling(), seed: int = 0):
    prefix = PrefixCache(target, drafter.feature_layers)
    prefix.prefill(prompt)
    context = torch.tensor(prompt, dtype=torch.long)
    return decode_turn(target, drafter, prefix.cache, context, prefix.features_for(drafter.feature_layers),
                       prefix.last_logits, k, sampling, max_new, torch.Generator().manual_seed(seed),
                       DeviceClock(target.device))


PROMPTS = [[1, 40, 41, 42, 43, 40, 41, 42], [1, 100, 7, 7, 7, 7, 9, 100, 7], list(range(4, 60))]


# ---- hand-built runs with known values (the report's tests) ---------------------------------------------------------
BASE_CONFIG = {"target_sha256": "t" * 64, "chat_template_sha256": "c" * 16, "enable_thinking": False,
               "temperature": 0.0, "top_p": 1.0, "top_k": 0, "k": 3, "max_new_tokens": 64, "seed": 0,
               "replay": "free", "context_policy": "stop", "dtype": "float32", "drafter_sha256": {},
               "target_name": "HuggingFaceTB/SmolLM2-135M-Instruct (test)", "environment": {"versions": {}}}


def turn(steps, decode_s=1.0, new_tokens=10, ar_decode_s=2.0, ar_new_tokens=10, stop_reason="eos",
         context_len=100, output_ids=(1, 2, 3)):
    """One turn: `steps` as (num_drafted, num_accepted) pairs."""
    return {"steps": steps, "decode_s": decode_s, "new_tokens": new_tokens, "ar_decode_s": ar_decode_s,
            "ar_new_tokens": ar_new_tokens, "stop_reason": stop_reason, "context_len": context_len,
            "output_ids": list(output_ids)}


def skipped_turn(context_len=5000):
    return turn([], 0.0, 0, 0.0, 0, stop_reason="skipped", context_len=context_len)


def write_run(directory: Path, task: str, methods: dict[str, dict[str, list[dict]]], **config) -> Path:
    """methods: method → sample_id → list of turns (see `turn`)."""
    store = RunStore(directory)
    store.prepare()
    for method, samples in methods.items():
        for sample_id, turns in samples.items():
            step_records, turn_records, earlier = [], [], []
            for index, t in enumerate(turns):
                context = t["context_len"]
                flagged, reason = degenerate.flag_reply(t["output_ids"], earlier)  # as the runner records it
                if t["stop_reason"] == "skipped":
                    flagged, reason = False, ""
                earlier.append((index, t["output_ids"]))
                for i, (drafted, accepted) in enumerate(t["steps"]):
                    step_records.append(StepRecord(
                        run_id=directory.name, method=method, task=task, sample_id=sample_id, turn=index, step=i,
                        context_len=context, num_drafted=drafted, num_accepted=accepted,
                        accept_flags=[j < accepted for j in range(drafted)], emitted=accepted + 1,
                        draft_s=0.001 * (i + 1), verify_s=0.01, step_s=0.012, draft_state_bytes=context * 8,
                        draft_history_bytes=context * 8))
                    context += accepted + 1
                turn_records.append(TurnRecord(
                    run_id=directory.name, method=method, task=task, sample_id=sample_id, turn=index, replay="free",
                    context_len=t["context_len"], prompt_tokens=t["context_len"], prefill_tokens=t["context_len"],
                    new_tokens=t["new_tokens"], num_steps=len(t["steps"]), prefill_s=0.1, draft_prefill_s=0.0,
                    decode_s=t["decode_s"], tau=float("nan"), ar_decode_s=t["ar_decode_s"],
                    ar_new_tokens=t["ar_new_tokens"], speedup_turn=float("nan"), stop_reason=t["stop_reason"],
                    skip_reason="too long" if t["stop_reason"] == "skipped" else "", dropped_tokens=0,
                    output_ids=t["output_ids"], degenerate=flagged, degenerate_reason=reason,
                    context_point=t.get("context_point", 0)))
            turn_records[-1].last = True
            for index, record in enumerate(turn_records):
                store.write_turn(sample_id, index, [s for s in step_records if s.turn == index], [record])
    store.write_config({**BASE_CONFIG, "task": task, "methods": list(methods), "run_id": directory.name,
                        "sample_ids": sorted({s for samples in methods.values() for s in samples}), **config})
    return directory


# alpha on gsm8k: steps (drafted, accepted); the (2, 1) step drafted only 2 of k=3 tokens.
ALPHA_GSM8K = {
    "s1": [turn([(3, 3), (3, 0), (2, 1)], decode_s=1.0, new_tokens=10, ar_decode_s=2.0, ar_new_tokens=10),
           turn([(3, 2)], decode_s=1.0, new_tokens=5, ar_decode_s=1.0, ar_new_tokens=5)],
    "s2": [turn([(3, 1), (0, 0)], decode_s=1.5, new_tokens=10, ar_decode_s=3.0, ar_new_tokens=10),
           skipped_turn()],
}


def load_steps(run_dir) -> pd.DataFrame:
    return read_run(run_dir).steps


def load_turns(run_dir) -> pd.DataFrame:
    return read_run(run_dir).turns


# ---- planted steps/turns frames (the report's statistics), with the columns `report.load.load_results` gives ---------
def turn_row(method: str, sample: str, turn: int, context: int, *, task: str = "swebench", run: str = "r",
             new_tokens: int = 64, decode_s: float = 1.0, ar_decode_s: float = 1.0, ar_new_tokens: int = 64,
             prefill_s: float = 0.0, prefill_tokens: int = 0, draft_prefill_s: float = 0.0,
             stop_reason: str = "max_new_tokens", output_ids=None, temperature: float = 0.0,
             degenerate: bool | None = None) -> dict:
    """`degenerate` None: not recorded (as in runs written before the flag), so the report computes it."""
    return {"run_id": run, "run": run, "method": method, "task": task, "sample_id": sample, "turn": turn,
            "replay": "logged", "context_len": context, "prompt_tokens": context, "prefill_tokens": prefill_tokens,
            "new_tokens": new_tokens, "num_steps": 0, "prefill_s": prefill_s, "draft_prefill_s": draft_prefill_s,
            "decode_s": decode_s, "tau": np.nan, "ar_decode_s": ar_decode_s, "ar_new_tokens": ar_new_tokens,
            "speedup_turn": np.nan, "stop_reason": stop_reason, "skip_reason": "", "dropped_tokens": 0,
            "dropped_messages": 0, "position": 0, "output_ids": list(output_ids or []), "worker_host": "",
            "worker_device": "cpu", "engine": "hf", "temperature": temperature,
            "degenerate": np.nan if degenerate is None else degenerate,
            "degenerate_reason": ""}


def step_row(method: str, sample: str, turn: int, step: int, context: int, drafted: int, accepted: int, *,
             task: str = "swebench", run: str = "r", emitted: int | None = None, draft_s: float = 0.0,
             verify_s: float = 0.0, step_s: float | None = None, state_bytes: int = 0,
             budget_limited: bool = False, temperature: float = 0.0) -> dict:
    emitted = accepted + 1 if emitted is None else emitted
    return {"run_id": run, "run": run, "method": method, "task": task, "sample_id": sample, "turn": turn,
            "step": step, "context_len": context, "num_drafted": drafted, "num_accepted": accepted,
            "accept_flags": [True] * accepted + [False] * (drafted - accepted), "emitted": emitted,
            "draft_s": draft_s, "verify_s": verify_s, "step_s": draft_s + verify_s if step_s is None else step_s,
            "draft_state_bytes": state_bytes, "draft_history_bytes": state_bytes, "engine": "hf",
            "budget_limited": budget_limited, "temperature": temperature}


def frames(turn_rows: list[dict], step_rows: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(steps, turns) DataFrames from rows."""
    return pd.DataFrame(step_rows), pd.DataFrame(turn_rows)


def steps_with_tau(method: str, sample: str, turn: int, context: int, tau: float, n_steps: int = 40,
                   k: int = 7, **kw) -> list[dict]:
    """n_steps fixed-k steps whose pooled τ is `tau` to within 1/n_steps (accepted values floor/ceil mixed)."""
    target = float(np.clip(tau, 1.0, k + 1.0)) - 1.0  # mean accepted drafts
    low = int(np.floor(target))
    n_high = int(round((target - low) * n_steps))
    values = [min(low + 1, k)] * n_high + [low] * (n_steps - n_high)
    return [step_row(method, sample, turn, i, context + i, k, a, **kw) for i, a in enumerate(values)]


def vllm_python() -> str | None:
    """The python that runs vLLM here (scripts/setup_vllm.sh), or None: the vLLM tests skip without it."""
    from evalsuite.engines import vllm_engine
    from evalsuite.errors import UserError

    try:
        return vllm_engine.find_vllm_python()
    except UserError:
        return None


def requires_vllm(test):
    """Skip `test` where vLLM's venv is not set up (`scripts/setup.sh --all` sets it up; CI does)."""
    import pytest

    return pytest.mark.skipif(vllm_python() is None, reason="vLLM venv not set up (scripts/setup_vllm.sh)")(test)


def load_script(path: Path, name: str):
    """A benchmarks/ script imported as module `name` (registered in sys.modules first: dataclasses look their
    module up while it executes)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
