"""The memory model of `evalsuite profile`: what a point allocates beyond the resident weights, estimated before
anything is allocated, and the budget it must fit in.

- The target: its weights (counted on the meta device), its KV bytes per token, and a point's KV cache (with the
  cache's chunk rounding), activations, logits and a worst-case attention transient (`target_point_bytes`).
- A drafter: its state per stream from a calibration at two small contexts (`single_stream_bytes`: bytes per token
  and fixed bytes), and a point's states, start of turn, logits and attention transient (`draft_point_bytes`).
- The device: its memory, the budget a point may use (`Budget`), out-of-memory errors, peak statistics.
"""

from __future__ import annotations

import gc
import math
from pathlib import Path

import torch

from evalsuite.errors import UserError
from evalsuite.methods.base import Method, Sampling
from evalsuite.profile.batched import ROOM
from evalsuite.target.model import TargetModel


def decoder_config(config):
    return config.get_text_config(decoder=True)


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """K and V of every layer for one token of one stream (the static cache keeps every layer's full history)."""
    c = decoder_config(config)
    kv_heads = int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
    head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    return int(c.num_hidden_layers) * 2 * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def weight_bytes_of(config, dtype: torch.dtype, layout: str = "row-major") -> int:
    """The weights' bytes, counted on the meta device (nothing allocated); the oneDNN block kernels keep a second
    copy of every fp32 Linear weight."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    size = torch.empty(0, dtype=dtype).element_size()
    params = {id(p): p for p in model.parameters()}.values()
    total = sum(p.numel() for p in params) * size
    if layout in ("column-major+onednn", "fused", "fused+onednn", "fused+panel") and dtype == torch.float32:  # block copies
        total += sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) * size
    return int(total)


def check_weights_fit(config, name: str, device: torch.device, dtype: torch.dtype, layout: str) -> None:
    """A one-line error, before anything is allocated, when the weights alone would not fit: on CPU 60 % of the
    memory available now (the machine is shared), on CUDA 90 % of the device's free memory."""
    need = weight_bytes_of(config, dtype, layout)
    if device.type == "cuda":
        have, where = int(torch.cuda.mem_get_info(device)[0] * 0.9), "free on the device"
    else:
        have, where = int(0.6 * _meminfo("MemAvailable")), "of the memory available on this machine (60 %)"
    if have and need > have:
        raise UserError(f"{name}: its {dtype} weights need {need / 2**30:.1f} GiB, more than the {have / 2**30:.1f} "
                        f"GiB {where}; profile a smaller shape here, or on a GPU (--device cuda)")


def module_bytes(module: torch.nn.Module) -> int:
    """Parameter and buffer bytes (shared tensors once), plus the oneDNN copies of the block kernels."""
    seen, total = set(), 0
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel() * tensor.element_size()
    for sub in module.modules():
        extra = sub.__dict__.get("onednn_weight")
        if extra is not None:
            total += extra.numel() * extra.element_size()
    return total


def packed_bytes(target: TargetModel) -> int:
    """The fused decoder's prepared copies for few-row products, MKL-packed or oneDNN-reordered (as many bytes as
    the weights they copy), 0 elsewhere."""
    fused = getattr(target, "fused", None)
    if fused is None or fused.head_packed is None:
        return 0
    weights = [w for layer in fused.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [fused.head]
    return sum(w.numel() * w.element_size() for w in weights)


def target_point_bytes(config, dtype: torch.dtype, batch: int, context: int, block: int, chunk: int = 1024) -> int:
    """Bytes one target point allocates beyond the resident weights: the KV cache (reserved in whole chunks),
    the block's activations and logits, and a worst-case attention transient (the scores of the math kernel and
    the GQA-folded mask; K/V are never repeated per query group: one-token decodes go to SDPA with `enable_gqa`,
    blocks to `kv_cache.gqa_sdpa`)."""
    c = decoder_config(config)
    size = torch.empty(0, dtype=dtype).element_size()
    heads = int(c.num_attention_heads)
    kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
    length = context + block
    kv = batch * math.ceil(length / chunk) * chunk * kv_bytes_per_token(config, dtype)
    rows = batch * block
    activations = rows * (6 * c.hidden_size + 3 * int(c.intermediate_size)) * size
    logits = rows * int(c.vocab_size) * (size + 4)
    scores = rows * heads * length * 4  # the math kernel's scores (fused kernels need none)
    mask = rows * (heads // kv_heads) * length
    return kv + activations + logits + scores + mask


def feature_rows(target: TargetModel, method: Method, rows: int) -> torch.Tensor | None:
    if not method.feature_layers:
        return None
    return torch.randn(rows, len(method.feature_layers), target.hidden_size, dtype=target.dtype,
                       device=target.device)


def single_stream_bytes(target: TargetModel, method: Method, ids: torch.Tensor, contexts: tuple[int, int]) -> dict:
    """Calibrate the drafter's state per stream: bytes at two small contexts → bytes per token and fixed bytes."""
    found = []
    for context in contexts:
        method.reset()
        method.start_turn(ids[: context + 1], feature_rows(target, method, context))
        method.propose(2, Sampling(), None)
        found.append(method.state_bytes().total)
    method.reset()
    per_token = max((found[1] - found[0]) / (contexts[1] - contexts[0]), 0.0)
    return {"per_token": per_token, "fixed": max(found[0] - per_token * contexts[0], 0.0)}


def draft_point_bytes(target: TargetModel, method: Method, calibration: dict, batch: int, context: int,
                      k: int) -> int:
    """Beyond the resident weights: every stream's state (×2 at batch 1, where the drafter's own caches grow by
    doubling), the batch-1 start of turn (random features of every context position, fused), the block's logits and
    a worst-case attention transient."""
    cal = calibration
    size = torch.empty(0, dtype=target.dtype).element_size()
    state = batch * (cal["per_token"] * (context + ROOM + 2 * k) + cal["fixed"])
    features = 0
    if batch == 1:
        state *= 2
        features = 3 * context * (len(method.feature_layers) + 2) * target.hidden_size * size
    heads = int(decoder_config(target.config).num_attention_heads)
    block = 2 * k + 2
    working = batch * block * (target.vocab_size * (size + 4) + heads * (context + block) * 4)
    return int(state + features + working)


def device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return _meminfo("MemTotal")


def _meminfo(key: str) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def parse_bytes(text: str) -> int:
    """'6GiB', '512MiB', '2e9' → bytes."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "kb": 1e3, "mb": 1e6, "gb": 1e9,
             "tb": 1e12, "b": 1}
    raw = text.strip().lower().replace(" ", "")
    for unit, factor in units.items():
        if raw.endswith(unit):
            try:
                return int(float(raw[: -len(unit)]) * factor)
            except ValueError:
                break
    try:
        return int(float(raw))
    except ValueError:
        raise UserError(f"--memory-budget {text}: write a size such as 6GiB or 512MiB") from None


class Budget:
    """The bytes a point may allocate beyond what is resident now. CUDA: the device's free memory (less a safety
    margin) or --memory-budget, whichever is smaller; CPU: --memory-budget, by default 40 % of the memory
    available when the profile starts, at most 6 GiB (other processes share this machine)."""

    def __init__(self, device: torch.device, limit: int | None = None, margin: float = 0.9):
        self.device = device
        self.limit = limit
        self.margin = margin
        if device.type != "cuda" and limit is None:
            self.limit = int(min(0.4 * _meminfo("MemAvailable"), 6 * (1 << 30)))

    def available(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            allowed = int(free * self.margin)
            return allowed if self.limit is None else min(allowed, self.limit)
        return int(self.limit)

    def describe(self) -> dict:
        return {"limit_bytes": self.limit, "cuda_free_margin": self.margin if self.device.type == "cuda" else None,
                "rule": "CUDA: free device memory × margin (and --memory-budget if given); CPU: --memory-budget, "
                        "default min(40 % of MemAvailable at start, 6 GiB)"}


def is_oom(err: BaseException) -> bool:
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    text = str(err).lower()
    return isinstance(err, (RuntimeError, MemoryError)) and ("out of memory" in text or "can't allocate" in text
                                                             or isinstance(err, MemoryError))


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> float:
    return float(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else float("nan")
