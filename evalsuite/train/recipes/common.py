"""What every recipe shares: per-sequence tensors from the feature cache, the recipe interface and its registry
(`register_recipe`, `recipe_for`), option parsing, and writing a checkpoint in a released format (config.json +
model.safetensors).

A learned method's recipe is one module of this package, named after the method, whose `Recipe` subclass is
decorated with `@register_recipe`; `recipes()` imports every module here (pkgutil), so no list names them."""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import pkgutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from evalsuite.errors import UserError
from evalsuite.train.features import FeatureCache
from evalsuite.train.loop import Batch, Stage

STORAGE_DTYPE = torch.float16  # shipped weights: half the bytes of fp32; loaders cast to the target dtype


@dataclass
class SeqData:
    """One training sequence, as tensors. Position i: tokens[i]; greedy[i] / topk_*[i] describe the target's
    next-token choice *at* i (i.e. for position i+1)."""

    tokens: torch.Tensor  # [T] long
    greedy: torch.Tensor  # [T] long
    topk_ids: torch.Tensor  # [T, K] long
    topk_probs: torch.Tensor  # [T, K] float32
    hidden: torch.Tensor  # [T, S, H] float32 for the requested layers
    prompt_end: int  # first reply position

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])


class SequenceReader:
    """Reads sequences from the cache for a fixed list of target layers (converted to float32 tensors)."""

    def __init__(self, cache: FeatureCache, layers: tuple[int, ...], who: str, device: torch.device):
        self.cache = cache
        self.index = cache.layer_index(layers, who)
        self.device = device

    def __call__(self, seq: int) -> SeqData:
        c = self.cache
        start, prompt_end, end = c.span(seq)
        hidden = np.asarray(c.hidden[start:end][:, self.index], dtype=np.float32)
        as_long = lambda a: torch.from_numpy(np.asarray(a, dtype=np.int64)).to(self.device)  # noqa: E731
        return SeqData(
            tokens=as_long(c.tokens[start:end]), greedy=as_long(c.greedy[start:end]),
            topk_ids=as_long(c.topk_ids[start:end]),
            topk_probs=torch.from_numpy(np.asarray(c.topk_probs[start:end], dtype=np.float32)).to(self.device),
            hidden=torch.from_numpy(hidden).to(self.device), prompt_end=prompt_end - start,
        )


def block_targets(seq: SeqData, anchors: torch.Tensor, offsets: torch.Tensor) -> dict[str, torch.Tensor]:
    """For predictions of the tokens at positions anchors[:, None] + offsets (offsets >= 1), the label (the
    target's greedy token there), the teacher-forced previous data token, the target's top-K distribution and
    a validity mask (position inside the sequence)."""
    pos = anchors[:, None] + offsets[None, :]  # position of the predicted token
    valid = pos < seq.length
    src = (pos - 1).clamp(max=seq.length - 1)  # the target's choice for position p is recorded at p-1
    return {"labels": seq.greedy[src], "prev": seq.tokens[src], "topk_ids": seq.topk_ids[src],
            "topk_probs": seq.topk_probs[src], "valid": valid}


def training_vocabulary(cache: FeatureCache, sequences: list[int], top: int) -> torch.Tensor:
    """Every token that is among the target's `top` choices at some reply position of `sequences` (plus every
    greedy label), sorted. The full-vocabulary recipes normalise their training softmax over this set: on CPU
    the V × H lm_head product dominates a step, and tokens the target never ranks that high carry ~no mass."""
    seen = np.zeros(cache.meta.vocab_size, dtype=bool)
    for seq in sequences:
        start, prompt_end, end = cache.span(seq)
        lo = max(prompt_end - 1, start)
        seen[np.asarray(cache.topk_ids[lo:end, :top]).reshape(-1)] = True
        seen[np.asarray(cache.greedy[lo:end])] = True
    return torch.from_numpy(np.flatnonzero(seen))


def draft_vocabulary(cache: FeatureCache, sequences: list[int], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` most frequent greedy target tokens over the reply positions of `sequences`, sorted by id
    (ties and unseen tokens filled by id order)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for seq in sequences:
        start, prompt_end, end = cache.span(seq)
        np.add.at(counts, np.asarray(cache.greedy[max(prompt_end - 1, start):end], dtype=np.int64), 1)
    order = np.lexsort((np.arange(vocab_size), -counts))[:size]
    return torch.from_numpy(np.sort(order))


class SubVocabulary:
    """Logits over a training vocabulary and the mapping of targets into it (ids outside it get -1)."""

    def __init__(self, vocab: torch.Tensor, vocab_size: int, device: torch.device):
        self.ids = vocab.to(device)
        self.index = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
        self.index[self.ids] = torch.arange(self.ids.numel(), device=device)

    def targets(self, tgt: dict[str, torch.Tensor], misses: bool = False) -> dict[str, torch.Tensor]:
        """Labels and top-K ids as sub-vocabulary indices; top-K entries outside it lose their probability.
        Training drops the positions whose label is outside; with `misses` (validating a head that can only
        propose these tokens) they stay, labelled -1, which no prediction matches."""
        ids = self.index[tgt["topk_ids"]]
        labels = self.index[tgt["labels"]]
        if misses:
            return {**tgt, "labels": labels, "topk_ids": ids.clamp(min=0), "topk_probs": tgt["topk_probs"] * (ids >= 0)}
        return {**tgt, "labels": labels.clamp(min=0), "topk_ids": ids.clamp(min=0),
                "topk_probs": tgt["topk_probs"] * (ids >= 0), "valid": tgt["valid"] & (labels >= 0)}


class Recipe:
    """A method's training recipe. Subclasses set the class attributes below, build their modules in
    __init__(target, cache, options, train_sequences), implement the hooks below and register with
    `@register_recipe`."""

    method: str = ""  # the method it trains (a learned method of evalsuite.catalog)
    options_type: type = object  # its size/schedule dataclass (`--set key=value`)
    default_steps: int = 0  # optimizer steps when --steps is not given
    # the target layers it reads: (num_target_layers, options) -> layer ids (the feature cache holds them)
    feature_layers: Callable[[int, object], tuple[int, ...]] = staticmethod(lambda num_layers, options: ())

    def __init__(self, target, options):
        """What every recipe starts from: the target, its options, the device, and the target layers it reads
        (`self.ids`)."""
        self.target = target
        self.options = options
        self.device = target.device
        self.ids = self.feature_layers(target.num_layers, options)

    def modules(self) -> dict[str, nn.Module]:
        raise NotImplementedError

    def stages(self, steps: int) -> list[Stage]:
        raise NotImplementedError

    def validate(self, batch: Batch) -> dict[str, float]:
        raise NotImplementedError

    def export(self, out_dir: Path) -> dict:
        """Write config.json + model.safetensors in the released format; return the config."""
        raise NotImplementedError

    def released_module(self) -> tuple[nn.Module, tuple[str, ...]]:
        """The module whose state_dict `export` writes, and the key prefixes it leaves out (frozen target parts)."""
        raise NotImplementedError

    def load_init(self, directory: Path, fresh: tuple[str, ...] = ()) -> dict:
        """Warm start: copy a released checkpoint of this method and these sizes into the trained module, except
        the keys under the prefixes `fresh`, which keep this recipe's own start (and may differ in shape).

        Keys and shapes must match exactly (a one-line error names the first that differ)."""
        from evalsuite.methods.checkpoints import detect_method, load_state_dict, load_weights, read_config

        directory = Path(directory)
        found = detect_method(read_config(directory))
        if found != self.method:
            raise UserError(f"--init {directory}: a {found} checkpoint, not {self.method}")
        module, left_out = self.released_module()
        state = load_state_dict(directory, device=next(module.parameters()).device)
        state = {k: v for k, v in state.items() if not k.startswith(fresh)} if fresh else state
        load_weights(module, state, f"--init {directory.name} ({self.method})", optional=left_out + fresh)
        return init_record(directory) | ({"not_copied": list(fresh)} if fresh else {})

    def describe(self) -> dict:
        return {}


def init_record(directory: Path) -> dict:
    """What a warm start came from: the checkpoint's directory name and sha256 and, when its training report is
    beside it, the training behind it (steps, wall and CPU seconds), so that a fine-tune's card can state the
    drafter's whole cost."""
    from evalsuite.methods.checkpoints import checkpoint_sha256

    record = {"from": directory.name, "checkpoint_sha256": checkpoint_sha256(directory)}
    report = directory / "training_report.json"
    if report.exists():
        prior = json.loads(report.read_text())
        record["prior"] = {"steps": prior.get("steps"), "training_seconds": prior.get("training_seconds"),
                           "training_cpu_seconds": prior.get("training_cpu_seconds"),
                           "init": prior.get("init")}
    return record


RECIPES: dict[str, type[Recipe]] = {}


def register_recipe(recipe: type[Recipe]) -> type[Recipe]:
    """Class decorator: register a recipe under its `method`."""
    if not recipe.method:
        raise TypeError(f"{recipe.__name__}: set `method` before @register_recipe")
    RECIPES[recipe.method] = recipe
    return recipe


def recipes() -> dict[str, type[Recipe]]:
    """Every recipe of this package, by method (importing each module registers its recipe)."""
    for info in pkgutil.iter_modules([str(Path(__file__).resolve().parent)]):
        if info.name != "common":
            importlib.import_module(f"{__package__}.{info.name}")
    return dict(sorted(RECIPES.items()))


def recipe_for(method: str) -> type[Recipe]:
    """The recipe that trains `method`; a method without one is a one-line error naming those with one."""
    found = recipes()
    if method not in found:
        raise UserError(f"--method {method}: no training recipe for it; choose one of {', '.join(found)}")
    return found[method]


def parse_overrides(cls, values: dict[str, str], method: str):
    """Build a recipe's size/schedule dataclass from `--set key=value` strings (types from the dataclass)."""
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, raw in values.items():
        if key not in known:
            raise UserError(f"--set {key}: not a {method} training option; choose from {', '.join(sorted(known))}")
        kind = type(getattr(cls(), key))
        try:
            kwargs[key] = kind(float(raw)) if kind is int else (raw.lower() in ("1", "true", "yes")
                                                                 if kind is bool else kind(raw))
        except ValueError:
            raise UserError(f"--set {key}={raw}: expected a {kind.__name__}") from None
    return cls(**kwargs)


def save_checkpoint(out_dir: Path, config: dict, state: dict[str, torch.Tensor]) -> None:
    """config.json + model.safetensors; floating tensors are stored in fp16, integer/bool buffers as they are."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v.detach().to(STORAGE_DTYPE) if v.is_floating_point() else v.detach()).contiguous().cpu()
               for k, v in state.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(without_local_paths(config), indent=2, sort_keys=True))


# Keys transformers fills with the directory a config was loaded from: a machine path, never part of a release.
LOCAL_PATH_KEYS = ("_name_or_path",)


def without_local_paths(config):
    """The config without the keys that hold where it was loaded from (at any depth), for a shippable config.json."""
    if isinstance(config, dict):
        return {k: without_local_paths(v) for k, v in config.items() if k not in LOCAL_PATH_KEYS}
    if isinstance(config, list):
        return [without_local_paths(v) for v in config]
    return config


def qwen3_layer_config(target, num_layers: int, intermediate_size: int) -> dict:
    """The drafter's Qwen3 layer config as a plain dict: the target's widths, heads, norms and RoPE, with the
    drafter's own depth and MLP width (written to config.json and read back by `qwen3_config`)."""
    from evalsuite.methods.draft_layers import default_layer_config

    cfg = default_layer_config(target, num_layers)
    cfg.intermediate_size = int(intermediate_size)
    out = cfg.to_dict()
    out.pop("transformers_version", None)
    return out


def feature_rms(cache: FeatureCache, layer_index: list[int], sequences: list[int], limit: int = 8192,
                normalize: bool = False) -> torch.Tensor:
    """Per layer and dimension, the RMS of the target features [S, H] over up to `limit` training positions
    (after dividing each vector by its own RMS when `normalize`, i.e. as an RMSNorm sees it).

    The target's hidden states carry massive activations: in SmolLM2's middle layers 2-3 dimensions hold
    95-99 % of the energy. A fusion layer initialised for unit-scale inputs then sees little else, and a few
    hundred CPU steps are not enough to unlearn that; initialising the fusion with these scales divided out
    (the architecture is unchanged) starts it on standardised features."""
    rows = []
    for seq in sequences:
        start, _, end = cache.span(seq)
        rows.append(np.asarray(cache.hidden[start:end][:, layer_index], dtype=np.float32))
        if sum(len(r) for r in rows) >= limit:
            break
    x = torch.from_numpy(np.concatenate(rows)[:limit])
    if normalize:
        x = x / x.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-6)
    return x.pow(2).mean(0).sqrt().clamp_min(1e-3)  # [S, H]


def scale_fusion_init_(linear: nn.Linear, rms: torch.Tensor) -> None:
    """Divide each input column of a fusion Linear (inputs = concatenated [S, H] features) by the RMS of the
    feature it reads."""
    with torch.no_grad():
        linear.weight.div_(rms.reshape(1, -1).to(linear.weight.device))


def target_final_norm(target) -> torch.Tensor:
    """The target's final RMSNorm scale. Drafters whose outputs feed the target's lm_head (or a low-rank copy of
    it) start their own final norm from it, so their outputs live in the scale the head expects from step 0."""
    return target.model.model.norm.weight.detach().float()


def lm_head_factors(target, rank: int, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank-R factorisation of the target's lm_head W [V, H] (or of its `rows` only, a draft vocabulary)
    ≈ A @ B, A [V, R], B [R, H] (truncated SVD, singular values split evenly), from the eigendecomposition of the
    small H × H Gram matrix."""
    W = target.lm_head.weight.detach().double()
    if rows is not None:
        W = W[rows.to(W.device)]
    eigvals, eigvecs = torch.linalg.eigh(W.T @ W)  # ascending
    top = eigvecs[:, -rank:].flip(-1)  # [H, R] right singular vectors
    sigma = eigvals[-rank:].flip(-1).clamp_min(1e-12).sqrt()
    A = (W @ top) / sigma.sqrt()  # = U Σ^{1/2}
    B = sigma.sqrt()[:, None] * top.T  # = Σ^{1/2} Vᵀ
    return A.float(), B.float()


HEAD_FIT_DIR = "head_fit"  # under the feature cache: fitted heads, one file per set of inputs


def reply_states(cache: FeatureCache, sequences: list[int], index: int,
                 limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored hidden state (feature slot `index`) and the target's greedy token at every reply position of
    `sequences`, in order (the first `limit` positions when given)."""
    rows, labels, count = [], [], 0
    for seq in sequences:
        start, prompt_end, end = cache.span(seq)
        lo = max(prompt_end - 1, start)
        rows.append(np.asarray(cache.hidden[lo:end, index], dtype=np.float32))
        labels.append(np.asarray(cache.greedy[lo:end], dtype=np.int64))
        count += end - lo
        if limit is not None and count >= limit:
            break
    return (torch.from_numpy(np.concatenate(rows)[:limit]), torch.from_numpy(np.concatenate(labels)[:limit]))


def fit_low_rank_head(cache: FeatureCache, sequences: list[int], last_layer: int, A: torch.Tensor,
                      B: torch.Tensor, steps: int, lr: float = 3e-3, batch: int = 256, seed: int = 0,
                      limit: int = 200_000, vocab: torch.Tensor | None = None) -> dict:
    """Fit a rank-R head logits = A (B h) in place, on the target's own last-layer (post-norm) hidden states h at
    reply positions of the training sequences, to the target's greedy token there (CE). With `vocab` (a draft
    vocabulary: A's row i is target id vocab[i]) positions whose token is outside it are not trained on and count
    as misses in the held-back accuracy.

    Why: the truncated SVD of a 49k-row lm_head keeps almost none of its argmax at small R (for SmolLM2, R=32
    agrees with the full head on 0.3 % of positions, R=256 on 10 %), and a head learned from scratch is most of
    what a few thousand CPU steps have to learn. This is a warm start of the same parameters; it reads no
    evaluation data and changes no architecture. Returns the fit's first/last loss and held-back accuracy.

    The fit is deterministic in its inputs, so its result is kept beside the feature cache
    (`<cache>/head_fit/<sha256 of the inputs>.safetensors`): a resumed or repeated training run reads it back
    instead of fitting again (on a 152k-token vocabulary the fit is ~20 CPU-minutes, and a resume used to redo it
    only for the checkpoint to overwrite it)."""
    if steps <= 0:
        return _fit_low_rank_head(cache, sequences, last_layer, A, B, steps, lr, batch, seed, limit, vocab)
    key = hashlib.sha256(json.dumps({
        "meta": cache.fingerprint(), "sequences": [int(s) for s in sequences],
        "last_layer": last_layer, "steps": steps, "lr": lr, "batch": batch, "seed": seed, "limit": limit,
        "shapes": [list(A.shape), list(B.shape)],
        **({"vocab": hashlib.sha256(vocab.cpu().numpy().tobytes()).hexdigest()} if vocab is not None else {})},
        sort_keys=True).encode())
    key.update(A.detach().float().cpu().numpy().tobytes())
    key.update(B.detach().float().cpu().numpy().tobytes())
    memo = cache.directory / HEAD_FIT_DIR / f"{key.hexdigest()[:24]}.safetensors"
    if memo.exists():
        with safe_open(str(memo), framework="pt") as stored:
            with torch.no_grad():
                A.copy_(stored.get_tensor("A"))
                B.copy_(stored.get_tensor("B"))
            return json.loads(stored.metadata()["fit"])
    fit = _fit_low_rank_head(cache, sequences, last_layer, A, B, steps, lr, batch, seed, limit, vocab)
    memo.parent.mkdir(exist_ok=True)
    tmp = memo.with_suffix(".tmp")
    save_file({"A": A.detach().contiguous().cpu(), "B": B.detach().contiguous().cpu()}, str(tmp),
              metadata={"fit": json.dumps(fit)})
    os.replace(tmp, memo)
    return fit


def _fit_low_rank_head(cache: FeatureCache, sequences: list[int], last_layer: int, A: torch.Tensor,
                       B: torch.Tensor, steps: int, lr: float, batch: int, seed: int, limit: int,
                       vocab: torch.Tensor | None = None) -> dict:
    h, y = reply_states(cache, sequences, cache.layer_index([last_layer], "the head warm start")[0], limit)
    h, y = h.to(A.device), y.to(A.device)
    if vocab is not None:  # target ids → rows of A; -1 outside the draft vocabulary
        y = SubVocabulary(vocab, cache.meta.vocab_size, A.device).index[y]
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(h.shape[0], generator=gen)
    n_held = min(2048, h.shape[0] // 10)
    held, train = perm[:n_held], perm[n_held:]
    train = train[y[train] >= 0]
    A.requires_grad_(True)
    B.requires_grad_(True)
    opt = torch.optim.AdamW([A, B], lr=lr, weight_decay=0.0)
    losses_seen = []
    for step in range(steps):
        idx = train[torch.randint(train.numel(), (batch,), generator=gen)]
        loss = torch.nn.functional.cross_entropy((h[idx] @ B.T) @ A.T, y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1.0 + math.cos(math.pi * step / max(steps, 1)))
        opt.step()
        losses_seen.append(float(loss.detach()))
    A.requires_grad_(False)
    B.requires_grad_(False)
    with torch.no_grad():
        accuracy = float((((h[held] @ B.T) @ A.T).argmax(-1) == y[held]).float().mean())
    return {"steps": steps, "positions": int(h.shape[0]), "first_loss": losses_seen[0] if losses_seen else None,
            "last_loss": float(np.mean(losses_seen[-20:])) if losses_seen else None,
            "held_back_greedy_accuracy": accuracy}


def param_count(module: nn.Module, exclude: tuple[str, ...] = ()) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if not n.startswith(exclude))


def chain_tau(predicted: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> float:
    """Greedy acceptance length (bonus included) of draft chains [N, K] against the target's greedy tokens."""
    from evalsuite.train.losses import greedy_tau

    return greedy_tau(predicted == labels, valid)
