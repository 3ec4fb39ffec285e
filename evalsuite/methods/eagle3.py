"""`eagle3`: EAGLE-3, a one-layer drafter over fused target features with a draft KV cache (methods.md §2).

Two released formats, told apart by `config.json` `architectures`:

- `LlamaForCausalLMEagle3` (SafeAILab EAGLE `eagle/model/cnets.py`, SpecForge `modeling/draft/llama3_eagle.py`):
  3 target layers (`eagle_config.eagle_aux_hidden_state_layer_ids`, else [1, L//2-1, L-4] of the target),
  `fc` 3·H_target → H (optional per-layer `fc_norm`), one Llama layer `midlayer` whose q/k/v read 2H, no q/k
  norm, `lm_head` over a reduced draft vocabulary mapped back by `d2t` (target id = draft id + d2t[draft id]),
  `embed_tokens` from the checkpoint when it carries one, else the target's.
- `Qwen3Eagle3Model` (DeepSpec `deepspec/modeling/eagle3/qwen3/modeling.py`): 5 target layers
  (`target_layer_ids`), `fc` 5H → H, one Qwen3 layer `layers.0` with q/k norms, full vocabulary, its own
  frozen copies of the target's `embed_tokens` and `lm_head`.

Both layers compute, for a feature row h and a token embedding e,
    x = cat(input_layernorm(e), hidden_norm(h));  h' = h + o_proj(attn(x));  out = h' + mlp(post_norm(h'))
and the logits are `lm_head(norm(out))`.

Draft-cache bookkeeping, as in DeepSpec's `deepspec/eval/eagle3/evaluator.py`: cache entry i pairs the target
feature of position i with the token at position i+1 and sits at rope position i, so the cache always holds
one entry per target feature (context length minus the anchor). A proposal starts from the output of the
newest entry; each further step re-feeds the draft's own un-normed output (no `fc`) with the token it just
drew, one position further. On commit the cache is cropped back to its length before the proposal and
extended with the target features of the anchor and the accepted drafts, paired with the accepted drafts and
the bonus token.

Only the newest entry's output is ever read (the reference discards the others too), and with a single
layer a cache entry depends on its own inputs alone, so an extend computes keys/values for every new entry
but the attention and MLP for the newest one only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, PretrainedConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from evalsuite.errors import UserError
from evalsuite.methods.base import Drafter, DraftState, Proposal, Sampling, register, tensor_bytes
from evalsuite.methods.checkpoints import check_fit, drafter_source, load_checkpoint, load_weights

METHOD = "eagle3"
SPECFORGE = "LlamaForCausalLMEagle3"
DEEPSPEC = "Qwen3Eagle3Model"
FORMATS = {"specforge": SPECFORGE, "deepspec": DEEPSPEC}
DEEPSPEC_NUM_FEATURE_LAYERS = 5  # deepspec/modeling/eagle3/common.py asserts exactly 5
INIT_STD = 0.02  # `initializer_range` of both reference configs, used for random-init drafters


# ---- configuration --------------------------------------------------------------------------------------------
def specforge_layer_ids(num_target_layers: int) -> tuple[int, ...]:
    """SpecForge's default capture layers (`algorithms/model_providers.py`); the same tensors as the official
    EAGLE's inputs of decoder layers 2, L//2 and L-3."""
    return (1, num_target_layers // 2 - 1, num_target_layers - 4)


def spread_layer_ids(num_target_layers: int, count: int) -> tuple[int, ...]:
    """The DFlash/DeepSpec spread: `count` ids from 1 to L-3, evenly spaced with Python rounding
    (gives DeepSpec's [1, 9, 17, 25, 33] for a 36-layer target)."""
    start, end = 1, num_target_layers - 3
    return tuple(int(round(start + i * (end - start) / (count - 1))) for i in range(count))


@dataclass(frozen=True)
class Eagle3Spec:
    """Everything that shapes an EAGLE-3 drafter, read from a released config.json (or derived from a target)."""

    architecture: str  # SPECFORGE or DEEPSPEC
    hidden_size: int
    target_hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    hidden_act: str
    attention_bias: bool
    vocab_size: int
    draft_vocab_size: int
    layer_ids: tuple[int, ...]
    fc_norm: bool = False  # SpecForge option: RMSNorm on each target layer's feature before fc
    norm_output: bool = True  # SpecForge option: lm_head reads norm(h) (DeepSpec always does)
    num_target_layers: int | None = None  # DeepSpec records the target depth it was trained on
    rope_config: PretrainedConfig | None = field(default=None, compare=False, repr=False)

    @property
    def qk_norm(self) -> bool:
        return self.architecture == DEEPSPEC

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size != self.vocab_size

    @property
    def format(self) -> str:
        return "specforge" if self.architecture == SPECFORGE else "deepspec"


def _strictly_increasing(ids) -> bool:
    return all(a < b for a, b in zip(ids, ids[1:]))


def spec_from_config(config: dict, num_target_layers: int, who: str) -> Eagle3Spec:
    """Read a released config.json. SpecForge's layer ids default to the target's depth; DeepSpec's are stored."""
    architectures = [str(a) for a in config.get("architectures") or []]
    architecture = next((a for a in architectures if a in (SPECFORGE, DEEPSPEC)), None)
    if architecture is None:
        raise UserError(f"{who}: architectures={architectures} is neither {SPECFORGE} nor {DEEPSPEC}; "
                        "pass an EAGLE-3 checkpoint")
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        layers = int(config.get("num_hidden_layers", 1))
        if architecture == DEEPSPEC:
            layers = int(config.get("draft_num_hidden_layers", layers))
        if layers != 1:
            # The DeepSpec evaluator asserts one layer (its multi-token cache extend is only exact then);
            # SpecForge/EAGLE define a single `midlayer`.
            raise UserError(f"{who}: {layers} draft layers; EAGLE-3 drafters have exactly one")
        common = dict(
            architecture=architecture,
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads", heads)),
            head_dim=int(config.get("head_dim") or hidden // heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            hidden_act=str(config.get("hidden_act", "silu")),
            vocab_size=int(config["vocab_size"]),
            rope_config=_rope_config(config),
        )
    except KeyError as err:
        raise UserError(f"{who}: config.json lacks {err.args[0]!r}; re-download the checkpoint") from None
    if architecture == SPECFORGE:
        eagle_config = config.get("eagle_config") or {}
        ids = eagle_config.get("eagle_aux_hidden_state_layer_ids") or specforge_layer_ids(num_target_layers)
        spec = Eagle3Spec(
            **common,
            target_hidden_size=int(config.get("target_hidden_size", hidden)),
            attention_bias=False,  # SpecForge/EAGLE build q/k/v/o without bias whatever the config says
            draft_vocab_size=int(config.get("draft_vocab_size", common["vocab_size"])),
            layer_ids=tuple(int(j) for j in ids),
            fc_norm=bool(config.get("fc_norm", False)),
            norm_output=bool(config.get("norm_output", True)),
        )
        expected = 3
    else:
        if "target_layer_ids" not in config:
            raise UserError(f"{who}: {DEEPSPEC} config.json lacks 'target_layer_ids'; re-download the checkpoint")
        spec = Eagle3Spec(
            **common,
            target_hidden_size=hidden,
            attention_bias=bool(config.get("attention_bias", False)),
            draft_vocab_size=common["vocab_size"],
            layer_ids=tuple(int(j) for j in config["target_layer_ids"]),
            num_target_layers=int(config["num_target_layers"]) if "num_target_layers" in config else None,
        )
        expected = DEEPSPEC_NUM_FEATURE_LAYERS
    if len(spec.layer_ids) != expected or not _strictly_increasing(spec.layer_ids):
        raise UserError(f"{who}: target layer ids {list(spec.layer_ids)} must be {expected} strictly increasing ids "
                        f"(a {num_target_layers}-layer target is too shallow for the default rule); use a "
                        "deeper target or a drafter trained for this one")
    return spec


_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "head_dim", "hidden_size",
              "num_attention_heads", "max_position_embeddings")


def _rope_config(config: dict) -> PretrainedConfig:
    """A transformers config holding only the checkpoint's rope settings (theta, scaling type), so that the
    rotary tables follow transformers' rules, as DeepSpec's Qwen3RotaryEmbedding does; the Llama and Qwen3
    rotary embeddings are the same code."""
    return LlamaConfig.from_dict({k: config[k] for k in _ROPE_KEYS if k in config})


def spec_for_target(target, fmt: str, draft_vocab_size: int | None = None) -> Eagle3Spec:
    """The default-size drafter of a target: DeepSpec builds its config as a copy of the target's with one
    layer (`eagle3/qwen3/config.py`); the SpecForge configs likewise mirror the target's widths."""
    cfg = target.config
    if fmt not in FORMATS:
        raise UserError(f"eagle3 format '{fmt}': choose one of {', '.join(FORMATS)}")
    architecture = FORMATS[fmt]
    L = target.num_layers
    layer_ids = specforge_layer_ids(L) if architecture == SPECFORGE else spread_layer_ids(
        L, DEEPSPEC_NUM_FEATURE_LAYERS)
    config = {k: v for k, v in cfg.to_dict().items() if k not in ("architectures", "model_type", "auto_map")}
    config.update(architectures=[architecture], num_hidden_layers=1, vocab_size=target.vocab_size,
                  hidden_size=target.hidden_size)
    if architecture == SPECFORGE:
        config["draft_vocab_size"] = int(draft_vocab_size or target.vocab_size)
        if not 0 < config["draft_vocab_size"] <= target.vocab_size:
            raise UserError(f"eagle3 draft_vocab_size {draft_vocab_size}: must be in 1..{target.vocab_size}")
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}
    else:
        config.update(target_layer_ids=list(layer_ids), num_target_layers=L)
    return spec_from_config(config, L, "eagle3 (random-init)")


# ---- modules --------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """Llama/Qwen3 RMSNorm: normalise in fp32, cast back, then scale."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (half-split convention); x [q, heads, d], cos/sin [q, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class DraftKVCache:
    """Keys and values of the one draft layer, [kv_heads, length, head_dim], in a buffer that grows by doubling."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, capacity: int = 256):
        self.keys = torch.empty(kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.values = torch.empty_like(self.keys)
        self.length = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """keys/values [q, kv_heads, head_dim]; returns the whole cache after the append."""
        end = self.length + keys.shape[0]
        if end > self.keys.shape[1]:
            capacity = max(end, 2 * self.keys.shape[1])
            for name in ("keys", "values"):
                old = getattr(self, name)
                grown = old.new_empty(old.shape[0], capacity, old.shape[2])
                grown[:, : self.length] = old[:, : self.length]
                setattr(self, name, grown)
        self.keys[:, self.length: end] = keys.transpose(0, 1)
        self.values[:, self.length: end] = values.transpose(0, 1)
        self.length = end
        return self.keys[:, :end], self.values[:, :end]

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def entry_bytes(self) -> int:
        return 2 * self.keys.shape[0] * self.keys.shape[2] * self.keys.element_size()

    def nbytes(self) -> int:
        """Bytes of the entries held (what a concatenating cache such as the reference's DynamicCache holds)."""
        return self.length * self.entry_bytes()


class Eagle3Attention(nn.Module):
    def __init__(self, spec: Eagle3Spec):
        super().__init__()
        self.heads = spec.num_attention_heads
        self.kv_heads = spec.num_key_value_heads
        self.head_dim = spec.head_dim
        width = 2 * spec.hidden_size  # q/k/v read cat(embedding, feature)
        bias = spec.attention_bias
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, spec.hidden_size, bias=bias)
        if spec.qk_norm:  # DeepSpec's Qwen3 layer normalises each head of q and k before rope
            self.q_norm = RMSNorm(self.head_dim, spec.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, spec.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: DraftKVCache,
                queries: int) -> torch.Tensor:
        """x [q, 2H] for q new cache entries; appends their keys/values and returns the attention output of the
        last `queries` entries [queries, H], each seeing the cache up to and including itself."""
        q_len = x.shape[0]
        keys = self.k_proj(x).view(q_len, self.kv_heads, self.head_dim)
        values = self.v_proj(x).view(q_len, self.kv_heads, self.head_dim)
        query = self.q_proj(x[q_len - queries:]).view(queries, self.heads, self.head_dim)
        if self.q_norm is not None:
            query, keys = self.q_norm(query), self.k_norm(keys)
        keys = _rotate(keys, cos, sin)
        query = _rotate(query, cos[q_len - queries:], sin[q_len - queries:])
        all_keys, all_values = cache.append(keys, values)
        mask = None
        if queries > 1:
            total = all_keys.shape[1]
            rows = torch.arange(total - queries, total, device=x.device)[:, None]
            mask = torch.arange(total, device=x.device)[None, :] <= rows
        out = F.scaled_dot_product_attention(query.transpose(0, 1)[None], all_keys[None], all_values[None],
                                             attn_mask=mask, scale=self.head_dim ** -0.5,
                                             enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out[0].transpose(0, 1).reshape(queries, self.heads * self.head_dim))


class Eagle3Layer(nn.Module):
    """The one draft decoder layer with a 2H attention input."""

    def __init__(self, spec: Eagle3Spec):
        super().__init__()
        self.self_attn = Eagle3Attention(spec)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.hidden_act)
        self.hidden_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor, cos, sin, cache: DraftKVCache,
                queries: int) -> torch.Tensor:
        x = torch.cat((self.input_layernorm(embeds), self.hidden_norm(hidden)), dim=-1)
        h = hidden[hidden.shape[0] - queries:] + self.self_attn(x, cos, sin, cache, queries)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Model(nn.Module):
    """Parameter names follow the released checkpoints: `midlayer.*` (SpecForge) or `layers.0.*` (DeepSpec)."""

    def __init__(self, spec: Eagle3Spec):
        super().__init__()
        self.spec = spec
        H = spec.hidden_size
        self.embed_tokens = nn.Embedding(spec.vocab_size, H)
        self.fc = nn.Linear(len(spec.layer_ids) * spec.target_hidden_size, H, bias=False)
        self.fc_norm = nn.ModuleList([RMSNorm(spec.target_hidden_size, spec.rms_norm_eps)
                                      for _ in spec.layer_ids]) if spec.fc_norm else None
        layer = Eagle3Layer(spec)
        if spec.architecture == SPECFORGE:
            self.midlayer = layer
            self.layers = None
        else:
            self.midlayer = None
            self.layers = nn.ModuleList([layer])
        self.norm = RMSNorm(H, spec.rms_norm_eps)
        self.lm_head = nn.Linear(H, spec.draft_vocab_size, bias=False)
        if spec.architecture == SPECFORGE and spec.reduced_vocab:
            self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(spec.vocab_size, dtype=torch.bool))
        else:
            self.d2t = self.t2d = None
        self.rotary = LlamaRotaryEmbedding(spec.rope_config)  # inv_freq is a non-persistent buffer

    @classmethod
    def empty(cls, spec: Eagle3Spec, device: torch.device, dtype: torch.dtype) -> "Eagle3Model":
        """Allocated but uninitialised on `device` (no CPU init of vocab-sized matrices): every parameter must
        then be loaded or initialised. Norms start at one, d2t at zero."""
        with torch.device("meta"):
            model = cls(spec)
        model = model.to_empty(device=device).to(dtype)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, RMSNorm):
                    module.weight.fill_(1.0)
            if model.d2t is not None:
                model.d2t.zero_(), model.t2d.zero_()
        model.rotary = LlamaRotaryEmbedding(spec.rope_config).to(device)
        return model

    def share_embedding(self, embedding: nn.Embedding) -> None:
        self.embed_tokens.weight = embedding.weight

    def share_lm_head(self, lm_head: nn.Linear) -> None:
        self.lm_head.weight = lm_head.weight

    @property
    def layer(self) -> Eagle3Layer:
        return self.midlayer if self.midlayer is not None else self.layers[0]

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [m, S, H_target] → [m, H]: concatenated in layer order (low … high), then fc."""
        if self.fc_norm is not None:
            features = torch.stack([norm(features[:, i]) for i, norm in enumerate(self.fc_norm)], dim=1)
        return self.fc(features.reshape(features.shape[0], -1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (float32) of un-normed draft outputs."""
        if self.spec.norm_output:
            hidden = self.norm(hidden)
        return self.lm_head(hidden).float()

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, cache: DraftKVCache,
                all_outputs: bool = False) -> torch.Tensor:
        """Append q entries (hidden [q, H] paired with tokens [q] at rope positions [q]) to the cache; return the
        outputs of the newest entry [1, H], or of every new entry when `all_outputs`."""
        cos, sin = self.rotary(hidden, positions[None])
        queries = hidden.shape[0] if all_outputs else 1
        return self.layer(hidden, self.embed_tokens(tokens), cos[0], sin[0], cache, queries)

    def draft_to_target(self) -> torch.Tensor:
        """[draft_vocab] target id of every draft id: id + d2t[id] (EAGLE `cnets.py topK_genrate`)."""
        ids = torch.arange(self.spec.draft_vocab_size, device=self.lm_head.weight.device)
        return ids + self.d2t if self.d2t is not None else ids


# ---- the drafter ----------------------------------------------------------------------------------------------
class Eagle3Drafter(Drafter):
    name = METHOD

    def __init__(self, model: Eagle3Model, target, weights: str, embed_source: str,
                 checkpoint_path: str | None = None, checkpoint_hash: str | None = None):
        self.model = model.eval()
        self.spec = model.spec
        self.feature_layers = self.spec.layer_ids
        self.device = target.device
        self.dtype = target.dtype
        self.vocab_size = target.vocab_size
        self.stop_ids = target.stop_ids
        self.weights = weights
        self.embed_source = embed_source
        self.checkpoint_path = checkpoint_path
        self.checkpoint_hash = checkpoint_hash
        self.target_ids = model.draft_to_target()
        self.cache = DraftKVCache(self.spec.num_key_value_heads, self.spec.head_dim, self.dtype, self.device)
        self.hidden: torch.Tensor | None = None  # un-normed output of the newest cache entry [1, H]
        self.length_before_proposal = 0
        self.working_bytes = 0

    # -- cache maintenance --
    def _extend(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        """Append pairs (features[i], tokens[i]) at the next rope positions; keep the newest output."""
        if tokens.numel() == 0:
            return
        start = self.cache.length
        positions = torch.arange(start, start + tokens.numel(), device=self.device)
        fused = self.model.fuse(features.to(self.device, self.dtype))
        self.hidden = self.model(fused, tokens.to(self.device), positions, self.cache)

    @torch.inference_mode()
    def start_turn(self, ids: torch.Tensor, features: torch.Tensor | None) -> None:
        if features is None or features.shape[0] != ids.numel() - 1:
            raise ValueError("eagle3 needs the target features of every context position before the anchor")
        self.cache.crop(0)
        self.hidden = None
        self._extend(features, ids[1:])  # feature i pairs with token i+1
        self.length_before_proposal = self.cache.length

    @torch.inference_mode()
    def commit(self, new_ids: torch.Tensor, new_features: torch.Tensor | None) -> None:
        # DeepSpec evaluator `_update`: crop to the length before the proposal, then extend with the committed
        # tokens paired with the target features of the anchor and the accepted drafts.
        self.cache.crop(self.length_before_proposal)
        self._extend(new_features, new_ids)
        self.length_before_proposal = self.cache.length

    # -- drafting --
    @torch.inference_mode()
    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        self.length_before_proposal = self.cache.length
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        hidden = self.hidden
        position = self.cache.length  # the anchor's position: entry (anchor feature, first draft) goes here
        for step in range(k if hidden is not None else 0):
            logits = self.model.logits(hidden)[0]
            if sampling.greedy:
                draft_id = logits.argmax().view(1)
            else:
                # DeepSpec `sample_tokens`: softmax(logits / T), nothing else; its probs are what we report
                p = torch.softmax(logits / sampling.temperature, dim=-1)
                draft_id = torch.multinomial(p.cpu(), 1, generator=generator).to(self.device)
                probs.append(torch.zeros(self.vocab_size, device=self.device).index_copy_(0, self.target_ids, p))
            token = self.target_ids[draft_id]
            tokens.append(token)
            if step == k - 1 or int(token) in self.stop_ids:
                break  # the reference would run one more forward whose output it never reads
            hidden = self.model(hidden, token, torch.tensor([position], device=self.device), self.cache)
            position += 1
        drafted = len(tokens)
        self.working_bytes = (tensor_bytes(self.hidden) + (position - self.length_before_proposal) *
                              self.cache.entry_bytes() + drafted * self.vocab_size * 4 * (not sampling.greedy))
        if not tokens:
            return Proposal(tokens=torch.empty(0, dtype=torch.long, device=self.device))
        return Proposal(tokens=torch.cat(tokens), probs=torch.stack(probs) if probs else None)

    def state_bytes(self) -> DraftState:
        # history: the draft KV of every context entry; working: the carried hidden, the proposal's transient
        # cache entries and, when sampling, the [k, V] proposal distributions.
        return DraftState(history=self.cache.nbytes(), working=self.working_bytes)

    def describe(self) -> dict:
        spec = self.spec
        return {**super().describe(), "format": spec.architecture, "weights": self.weights,
                "embed_tokens": self.embed_source, "hidden_size": spec.hidden_size,
                "intermediate_size": spec.intermediate_size, "draft_vocab_size": spec.draft_vocab_size,
                "qk_norm": spec.qk_norm}


# ---- building -------------------------------------------------------------------------------------------------
def _random_init(model: Eagle3Model, seed: int, skip: tuple[nn.Module, ...]) -> None:
    """N(0, INIT_STD) for every linear weight (zero bias) except the modules in `skip`, drawn on the CPU so
    that a seed gives the same drafter on every device."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and not any(module is m for m in skip):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * INIT_STD)
                if module.bias is not None:
                    module.bias.zero_()


def load_drafter(target, source: str) -> Eagle3Drafter:
    checkpoint = load_checkpoint(source, METHOD)
    who = f"eagle3 drafter {source}"
    spec = spec_from_config(checkpoint.config, target.num_layers, who)
    check_fit(target, who, hidden_size=spec.target_hidden_size, vocab_size=spec.vocab_size,
              layer_ids=spec.layer_ids, num_target_layers=spec.num_target_layers)
    _check_not_final_layer(target, spec, who)
    state = checkpoint.state_dict(target.device, target.dtype)
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}  # derived, never trained
    if spec.architecture == SPECFORGE and not spec.reduced_vocab:
        state.pop("d2t", None), state.pop("t2d", None)  # EAGLE `ea_model.py` drops them for a full vocabulary
    model = Eagle3Model.empty(spec, target.device, target.dtype)
    optional: tuple[str, ...] = ()
    embed_source = "checkpoint"
    if spec.architecture == SPECFORGE and "embed_tokens.weight" not in state:
        # EAGLE loads the target's embedding unless the checkpoint carries its own (`cnets.py` Model.__init__)
        model.share_embedding(target.embed_tokens)
        optional, embed_source = ("embed_tokens.",), "target"
    load_weights(model, state, who, optional=optional)
    if model.d2t is not None:
        _check_vocab_map(model, who)
    return Eagle3Drafter(model, target, "checkpoint", embed_source, str(checkpoint.path), checkpoint.sha256)


def _check_not_final_layer(target, spec: Eagle3Spec, who: str) -> None:
    # The target's last "layer" state is taken after its final norm; DeepSpec asserts it is never a feature.
    if target.num_layers - 1 in spec.layer_ids:
        raise UserError(f"{who}: reads the target's last layer {target.num_layers - 1} (post-norm); use a drafter "
                        "trained for this target")


def _check_vocab_map(model: Eagle3Model, who: str) -> None:
    ids = model.draft_to_target()
    if int(ids.min()) < 0 or int(ids.max()) >= model.spec.vocab_size or ids.unique().numel() != ids.numel():
        raise UserError(f"{who}: d2t does not map the draft vocabulary one-to-one into the target vocabulary; "
                        "re-download the checkpoint")


def random_drafter(target, fmt: str = "deepspec", seed: int = 0, draft_vocab_size: int | None = None
                   ) -> Eagle3Drafter:
    """An untrained drafter of the default size for this target. Like a fresh DeepSpec drafter (and EAGLE's
    load_emb) it uses the target's embedding and, at full vocabulary, the target's lm_head; everything else is
    N(0, 0.02). A reduced SpecForge vocabulary maps onto the first target ids (no token counts to choose by)."""
    spec = spec_for_target(target, fmt, draft_vocab_size)
    check_fit(target, "eagle3 (random-init)", layer_ids=spec.layer_ids)
    _check_not_final_layer(target, spec, "eagle3 (random-init)")
    model = Eagle3Model.empty(spec, target.device, target.dtype)
    model.share_embedding(target.embed_tokens)
    if not spec.reduced_vocab:
        model.share_lm_head(target.lm_head)
    _random_init(model, seed, skip=() if spec.reduced_vocab else (model.lm_head,))
    if spec.reduced_vocab:  # the first draft_vocab_size target ids: d2t[i] = 0
        model.t2d[: spec.draft_vocab_size] = True
    return Eagle3Drafter(model, target, "random-init", "target")


@register(METHOD, "EAGLE-3: one draft layer over fused target features, draft KV cache, chain drafting "
                  "(SpecForge/EAGLE and DeepSpec checkpoints)")
def build(target, options: dict) -> Drafter:
    source = drafter_source(METHOD, options)
    if source is not None:
        return load_drafter(target, source)
    vocab = options.get("draft_vocab_size")
    return random_drafter(target, str(options.get("format", "deepspec")), int(options.get("seed", 0)),
                          int(vocab) if vocab else None)
