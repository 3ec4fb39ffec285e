"""`eagle3`: EAGLE-3, a one-layer drafter over fused target features with a draft KV cache (docs/methods.md §2).

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

With `window` W (docs/methods.md §7) each query entry at position p sees the entries p-W+1 … p only, at their
absolute rope positions; the cache builds and keeps only those (`evalsuite.methods.window`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from evalsuite.catalog import SEED, MethodSpec, Option, Speculative, positive
from evalsuite.errors import UserError
from evalsuite.methods.base import Method, DraftState, Proposal, Sampling, common_prefix_len, tensor_bytes
from evalsuite.methods.checkpoints import check_fit, drafter_source, load_checkpoint, load_weights
from evalsuite.methods.draft_layers import (RMSNorm, SwiGLU, choose_token, evenly_spaced_zlab, init_random_,
                                            full_attention_rope, materialize, qwen3_config, rotate)
from evalsuite.methods.window import DraftRows
from evalsuite.target import cpu_kernels
from evalsuite.target.buffers import GrowableBuffer


SPEC = MethodSpec(
    "eagle3", "EAGLE-3: one draft layer over fused target features, draft KV cache, chain drafting", True,
    {"format": Option(str, "random init: deepspec | specforge layout", lambda v: v in ("deepspec", "specforge"),
                      "choose deepspec or specforge"),
     "draft_vocab_size": Option(int, "random init: reduced draft vocabulary size", positive, "must be >= 1"),
     "seed": SEED},
    windowable=True, batched=True, engines={"vllm": Speculative("eagle3", drafter=True)})


METHOD = "eagle3"
SPECFORGE = "LlamaForCausalLMEagle3"
DEEPSPEC = "Qwen3Eagle3Model"
FORMATS = {"specforge": SPECFORGE, "deepspec": DEEPSPEC}
DEEPSPEC_NUM_FEATURE_LAYERS = 5  # deepspec/modeling/eagle3/common.py asserts exactly 5


# ---- configuration --------------------------------------------------------------------------------------------
def specforge_layer_ids(num_target_layers: int) -> tuple[int, ...]:
    """SpecForge's default capture layers (`algorithms/model_providers.py`); the same tensors as the official
    EAGLE's inputs of decoder layers 2, L//2 and L-3."""
    return (1, num_target_layers // 2 - 1, num_target_layers - 4)


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


def _strictly_increasing(ids) -> bool:
    return all(a < b for a, b in zip(ids, ids[1:]))


def _layer_config(config: dict, architecture: str, who: str) -> PretrainedConfig:
    """The layer config as the references read config.json: SpecForge/EAGLE as a `LlamaConfig`, DeepSpec as a
    `Qwen3Config` (so absent keys take those classes' defaults, e.g. Qwen3's head_dim 128)."""
    if architecture == DEEPSPEC:
        return qwen3_config(config, who)
    fields = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "torch_dtype", "dtype")}
    try:
        return LlamaConfig.from_dict(fields)
    except (TypeError, ValueError, KeyError) as err:
        raise UserError(f"{who}: config.json is not a valid Llama layer config ({err}); re-download the checkpoint")


def spec_from_config(config: dict, num_target_layers: int, who: str) -> Eagle3Spec:
    """Read a released config.json. SpecForge's layer ids default to the target's depth; DeepSpec's are stored."""
    architectures = [str(a) for a in config.get("architectures") or []]
    architecture = next((a for a in architectures if a in (SPECFORGE, DEEPSPEC)), None)
    if architecture is None:
        raise UserError(f"{who}: architectures={architectures} is neither {SPECFORGE} nor {DEEPSPEC}; "
                        "pass an EAGLE-3 checkpoint")
    cfg = _layer_config(config, architecture, who)
    layers = int(config.get("draft_num_hidden_layers", cfg.num_hidden_layers))
    if layers != 1:
        # The DeepSpec evaluator asserts one layer (its multi-token cache extend is only exact then);
        # SpecForge/EAGLE define a single `midlayer`.
        raise UserError(f"{who}: {layers} draft layers; EAGLE-3 drafters have exactly one")
    common = dict(
        architecture=architecture,
        hidden_size=int(cfg.hidden_size),
        intermediate_size=int(cfg.intermediate_size),
        num_attention_heads=int(cfg.num_attention_heads),
        num_key_value_heads=int(cfg.num_key_value_heads),
        # SpecForge: config.head_dim when set, else H // heads (EAGLE's cnets.py always uses H // heads)
        head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads),
        rms_norm_eps=float(cfg.rms_norm_eps),
        hidden_act=str(cfg.hidden_act),
        vocab_size=int(cfg.vocab_size),
        rope_config=cfg,
    )
    if architecture == SPECFORGE:
        eagle_config = config.get("eagle_config") or {}
        ids = eagle_config.get("eagle_aux_hidden_state_layer_ids") or specforge_layer_ids(num_target_layers)
        spec = Eagle3Spec(
            **common,
            target_hidden_size=int(config.get("target_hidden_size", cfg.hidden_size)),
            attention_bias=False,  # SpecForge/EAGLE build q/k/v/o without bias whatever the config says
            draft_vocab_size=int(config.get("draft_vocab_size", cfg.vocab_size)),
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
            target_hidden_size=int(cfg.hidden_size),
            attention_bias=bool(cfg.attention_bias),
            draft_vocab_size=int(cfg.vocab_size),
            layer_ids=tuple(int(j) for j in config["target_layer_ids"]),
            num_target_layers=int(config["num_target_layers"]) if "num_target_layers" in config else None,
        )
        expected = DEEPSPEC_NUM_FEATURE_LAYERS
    if len(spec.layer_ids) != expected or not _strictly_increasing(spec.layer_ids):
        raise UserError(f"{who}: target layer ids {list(spec.layer_ids)} must be {expected} strictly increasing ids "
                        f"(a {num_target_layers}-layer target is too shallow for the default rule); use a "
                        "deeper target or a drafter trained for this one")
    return spec


def spec_for_target(target, fmt: str, draft_vocab_size: int | None = None) -> Eagle3Spec:
    """The default-size drafter of a target, configured the way DeepSpec's `build_draft_config` does it (a copy
    of the target's config with one layer); the SpecForge configs likewise mirror the target's widths."""
    if fmt not in FORMATS:
        raise UserError(f"eagle3 format '{fmt}': choose one of {', '.join(FORMATS)}")
    architecture = FORMATS[fmt]
    L = target.num_layers
    # DeepSpec's [1, 9, 17, 25, 33] for 36 layers is the z-lab spread (1 .. L-3, rounded); scaled to this depth
    layer_ids = specforge_layer_ids(L) if architecture == SPECFORGE else tuple(evenly_spaced_zlab(
        L, DEEPSPEC_NUM_FEATURE_LAYERS))
    config = {k: v for k, v in target.config.to_dict().items() if k not in ("model_type", "auto_map")}
    config.update(architectures=[architecture], num_hidden_layers=1, layer_types=["full_attention"],
                  rope_parameters=full_attention_rope(target.config), vocab_size=target.vocab_size, hidden_size=target.hidden_size, tie_word_embeddings=False)
    if architecture == SPECFORGE:
        config["draft_vocab_size"] = int(draft_vocab_size or target.vocab_size)
        if not 0 < config["draft_vocab_size"] <= target.vocab_size:
            raise UserError(f"eagle3 draft_vocab_size {draft_vocab_size}: must be in 1..{target.vocab_size}")
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}
    else:
        config.update(target_layer_ids=list(layer_ids), num_target_layers=L, draft_num_hidden_layers=1)
    return spec_from_config(config, L, "eagle3 (random-init)")


# ---- modules --------------------------------------------------------------------------------------------------
class DraftKVCache(DraftRows):
    """Keys and values of the one draft layer, [kv_heads, rows, head_dim], in `GrowableBuffer`s that grow by
    doubling (256 entries first). Entry rows sit at absolute positions [base, length) (`DraftRows`): base stays
    0 unless a window lets the oldest entries go."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, capacity: int = 256,
                 window: int | None = None):
        super().__init__(window)
        self.keys = self.new_buffer(axis=1, minimum=capacity)
        self.values = self.new_buffer(axis=1, minimum=capacity)
        self._entry_bytes = 2 * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()
        self.keep_from = 0  # set by the owner: entries before this position are never read again

    def buffers(self) -> list[GrowableBuffer]:
        return [self.keys, self.values]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """keys/values [q, kv_heads, head_dim]; returns every held entry after the append."""
        self.make_room(keys.shape[0], self.keep_from)
        start, self.length = self.held, self.length + keys.shape[0]
        return self.keys.write(start, keys.transpose(0, 1)), self.values.write(start, values.transpose(0, 1))

    def entry_bytes(self) -> int:
        return self._entry_bytes

    def nbytes(self) -> int:
        """Bytes of the entries held (what a concatenating cache such as the reference's DynamicCache holds)."""
        return self.held * self.entry_bytes()


class Eagle3Attention(nn.Module):
    # set by TargetModel.prepare_drafter where the target's decoder attends with evalsuite's CPU attention kernel:
    # the draft layer's attention over its KV cache then runs on the same kernel (fp32 on a CPU, inference)
    kernel_attention = False

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
        keys = rotate(keys, cos, sin)
        query = rotate(query, cos[q_len - queries:], sin[q_len - queries:])
        all_keys, all_values = cache.append(keys, values)
        start = cache.read_from(cache.length - queries)  # a window: the oldest entry the first query sees
        if start:
            all_keys, all_values = all_keys[:, start:], all_values[:, start:]
        if self.kernel_attention and (cache.window is None or queries == 1) \
                and cpu_kernels.heads_fit(query, self.kv_heads):
            out = cpu_kernels.attend_heads(query, all_keys, all_values, queries, self.head_dim ** -0.5)  # causal
            return self.o_proj(out)
        mask = None
        if queries > 1:
            total = all_keys.shape[1]
            rows = torch.arange(total - queries, total, device=x.device)[:, None]
            columns = torch.arange(total, device=x.device)[None, :]
            mask = columns <= rows
            if cache.window is not None:  # each query sees itself and the window - 1 entries before it
                mask &= columns > rows - cache.window
        out = F.scaled_dot_product_attention(query.transpose(0, 1)[None], all_keys[None], all_values[None],
                                             attn_mask=mask, scale=self.head_dim ** -0.5,
                                             enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out[0].transpose(0, 1).reshape(queries, self.heads * self.head_dim))


class Eagle3Layer(nn.Module):
    """The one draft decoder layer with a 2H attention input."""

    def __init__(self, spec: Eagle3Spec):
        super().__init__()
        self.self_attn = Eagle3Attention(spec)
        self.mlp = SwiGLU(spec)  # reads hidden_size, intermediate_size, hidden_act
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
        """Allocated but uninitialised on `device` (no CPU init of vocab-sized matrices): every parameter and
        buffer must then be loaded or initialised. The rotary tables are rebuilt in float32."""
        model = materialize(lambda: cls(spec), device, dtype)
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
class Eagle3Method(Method):
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
        self.target_id_list: list[int] = self.target_ids.tolist()  # host copy: no device sync per drafted token
        self.window: int | None = None  # --method-option eagle3.window (docs/methods.md §7)
        self.cache = self._new_cache()
        self.hidden: torch.Tensor | None = None  # un-normed output of the newest cache entry [1, H]
        self.ids = torch.empty(0, dtype=torch.long, device=self.device)  # the context, anchor last
        self.length_before_proposal = 0
        self.working_bytes = 0

    # -- cache maintenance --
    def _new_cache(self) -> DraftKVCache:
        return DraftKVCache(self.spec.num_key_value_heads, self.spec.head_dim, self.dtype, self.device,
                            window=self.window)

    def use_window(self, window: int | None) -> None:
        """Attend to the last `window` cache entries only (each query sees itself and window - 1 entries before
        it) and keep at most window + SLACK of them; None = the whole context. Set before the first turn."""
        self.window = window
        self.cache = self._new_cache()
        self.ids = self.ids[:0]

    def _settled(self) -> None:
        """After a start or a commit: the length a proposal starts from and rolls back to; entries older than the
        window of its first query are never read again."""
        self.length_before_proposal = self.cache.length
        self.cache.keep_from = self.cache.oldest_read(self.cache.length)

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
        # Entry i pairs feature i with token i+1, and its K/V depend on nothing else (one layer), so entries whose
        # tokens up to i+1 are unchanged since the last turn are kept, as a serving engine's prefix cache would.
        # The last entry is always recomputed: its output is the hidden state the first proposal starts from.
        # Under a window the newest entry reads back to `needed` only, so older entries are neither kept nor built.
        kept = max(min(common_prefix_len(self.ids, ids) - 1, self.cache.length, ids.numel() - 2), 0)
        needed = self.cache.oldest_read(ids.numel() - 2)
        if self.cache.covers(kept, needed):
            self.cache.crop(kept)
        else:
            self.cache.restart(needed)
        self.cache.keep_from = needed
        self.hidden = None
        self.ids = ids.detach().clone()
        start = self.cache.length
        self._extend(features[start:], ids[start + 1:])
        self._settled()

    @torch.inference_mode()
    def commit(self, new_ids: torch.Tensor, new_features: torch.Tensor | None) -> None:
        # DeepSpec evaluator `_update`: crop to the length before the proposal, then extend with the committed
        # tokens paired with the target features of the anchor and the accepted drafts.
        self.cache.crop(self.length_before_proposal)
        self._extend(new_features, new_ids)
        self.ids = torch.cat([self.ids, new_ids.to(self.ids.device)])
        self._settled()

    # -- drafting --
    @torch.inference_mode()
    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        self.length_before_proposal = self.cache.length
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        hidden = self.hidden
        position = self.cache.length  # the anchor's position: entry (anchor feature, first draft) goes here
        for step in range(k if hidden is not None else 0):
            # DeepSpec `sample_tokens`: argmax, or a draw from softmax(logits / T) and nothing else
            draft_id, p = choose_token(self.model.logits(hidden)[0], sampling.temperature, generator)
            token = self.target_id_list[draft_id]
            tokens.append(token)
            if p is not None:  # the distribution drawn from, moved to the target ids the draft ids stand for
                probs.append(torch.zeros(self.vocab_size, device=self.device).index_copy_(0, self.target_ids, p))
            if step == k - 1 or token in self.stop_ids:
                break  # the reference would run one more forward whose output it never reads
            hidden = self.model(hidden, torch.tensor([token], device=self.device),
                                torch.tensor([position], device=self.device), self.cache)
            position += 1
        self.working_bytes = (tensor_bytes(self.hidden) + (position - self.length_before_proposal) *
                              self.cache.entry_bytes() + len(probs) * self.vocab_size * 4)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        return Proposal(tokens=ids, probs=torch.stack(probs) if probs else None)

    def state_bytes(self) -> DraftState:
        # history: the draft KV of every context entry held (under a window at most window + SLACK); working: the carried hidden, the proposal's transient
        # cache entries and, when sampling, the [k, V] proposal distributions.
        return DraftState(history=self.cache.nbytes(), working=self.working_bytes)

    def describe(self) -> dict:
        spec = self.spec
        return {**super().describe(), "format": spec.architecture, "weights": self.weights,
                "embed_tokens": self.embed_source, "hidden_size": spec.hidden_size,
                "intermediate_size": spec.intermediate_size, "draft_vocab_size": spec.draft_vocab_size,
                "qk_norm": spec.qk_norm, "window": self.window}


# ---- building -------------------------------------------------------------------------------------------------
def load_drafter(target, source: str) -> Eagle3Method:
    checkpoint = load_checkpoint(source, METHOD)
    who = f"eagle3 drafter {source}"
    spec = spec_from_config(checkpoint.config, target.num_layers, who)
    check_fit(target, who, hidden_size=spec.target_hidden_size, vocab_size=spec.vocab_size,
              layer_ids=spec.layer_ids, num_target_layers=spec.num_target_layers, trained_for=checkpoint.trained_for)
    _check_not_final_layer(target, spec, who)
    state = checkpoint.state_dict(target.device, target.dtype)
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}  # derived, never trained
    if spec.architecture == SPECFORGE and not spec.reduced_vocab:
        state.pop("d2t", None), state.pop("t2d", None)  # EAGLE `ea_model.py` drops them for a full vocabulary
    model = Eagle3Model.empty(spec, target.device, target.dtype)
    optional: tuple[str, ...] = ()
    embed_source = "checkpoint"
    if spec.architecture == SPECFORGE and "embed_tokens.weight" not in state:
        # EAGLE loads the target's embedding unless the checkpoint carries its own (`cnets.py` Model.__init__),
        # which only fits when the draft is as wide as the target
        if spec.hidden_size != target.hidden_size:
            raise UserError(f"{who}: no embed_tokens.weight and a draft width {spec.hidden_size} != target width "
                            f"{target.hidden_size}; use a checkpoint that carries its embedding")
        model.share_embedding(target.embed_tokens)
        optional, embed_source = ("embed_tokens.",), "target"
    load_weights(model, state, who, optional=optional)
    if model.d2t is not None:
        _check_vocab_map(model, who)
    return Eagle3Method(model, target, "checkpoint", embed_source, str(checkpoint.path), checkpoint.sha256)


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
                   ) -> Eagle3Method:
    """An untrained drafter of the default size for this target. Like a fresh DeepSpec drafter (and EAGLE's
    load_emb) it uses the target's embedding and, at full vocabulary, the target's lm_head; everything else is
    N(0, 0.02). A reduced SpecForge vocabulary maps onto the first target ids (no token counts to choose by)."""
    spec = spec_for_target(target, fmt, draft_vocab_size)
    check_fit(target, "eagle3 (random-init)", layer_ids=spec.layer_ids)
    _check_not_final_layer(target, spec, "eagle3 (random-init)")
    model = Eagle3Model.empty(spec, target.device, target.dtype)
    init_random_(model, seed)  # before sharing: it writes every linear and embedding weight
    model.share_embedding(target.embed_tokens)
    if not spec.reduced_vocab:
        model.share_lm_head(target.lm_head)
    else:  # the first draft_vocab_size target ids: d2t = 0
        model.d2t.zero_()
        model.t2d.copy_(torch.arange(spec.vocab_size, device=target.device) < spec.draft_vocab_size)
    return Eagle3Method(model, target, "random-init", "target")


def recognises(config: dict) -> bool:
    """A released EAGLE-3 checkpoint: `LlamaForCausalLMEagle3` (original/SpecForge) or `Qwen3Eagle3Model`
    (DeepSpec) (docs/methods.md §2)."""
    return any("Eagle3" in str(a) for a in config.get("architectures") or [])


def build(target, options: dict) -> Method:
    source = drafter_source(METHOD, options, target)
    if source is not None:
        drafter = load_drafter(target, source)
    else:
        vocab = options.get("draft_vocab_size")
        drafter = random_drafter(target, str(options.get("format", "deepspec")), int(options.get("seed", 0)),
                                 int(vocab) if vocab else None)
    drafter.use_window(options.get("window"))
    return drafter
