"""`dflash`: DFlash block drafting (Chen, Liang, Liu 2026; docs/methods.md §3), in both released layouts.

z-lab layout (`z-lab/Qwen3-{4B,8B}-DFlash-b16`, z-lab `dflash/model.py`):
- target layers `dflash_config.target_layer_ids` (default: z-lab `build_target_layer_ids(num_target_layers,
  num_hidden_layers)`), read as hidden_states[j+1], concatenated → `fc` (no bias) → `hidden_norm`;
- Qwen3 layers, bidirectional attention of the block over [context; block], a draft KV cache over the whole
  context (extended with the verified tokens' features, the block's K/V cropped away after every forward),
  absolute positions;
- block = [anchor, MASK × (B-1)] embedded with the *target's* `embed_tokens`; the outputs of slots 1…B-1 go
  through the *target's* `lm_head`: the mask at position a+k predicts the token at a+k (k = 1…B-1), so b16 gives
  15 proposals; slot 0 (the anchor) predicts nothing;
- the draft is always greedy (z-lab `sample(draft_logits)` at its default temperature 0), also when the target
  samples: the proposal is then one-hot (probs None), which with rejection sampling is exactly z-lab's
  "accept while the draft equals the target's sample".

DeepSpec layout (`deepseek-ai/dflash_qwen3_{4b,8b}_block7`): a `Qwen3DSparkModel` with `markov_rank 0` and no
confidence head (DeepSpec `config/dflash/*.py`): own frozen embed/lm_head copies, every slot predicts (slot j →
a+j+1, 7 proposals), sampled at the target temperature with proposal softmax(logits / T). It runs through
`dspark.DeepSpecMethod`.

Random-init default (no checkpoint): the z-lab layout with block 16, 5 layers of the target's layer sizes and
z-lab's target-layer rule; `options["layout"] = "block7"` gives the DeepSpec layout instead.

z-lab keys: `layers.{i}.…`, `norm.weight`, `fc.weight` [H, n·H], `hidden_norm.weight`; config keys
`block_size`, `num_target_layers`, `dflash_config {mask_token_id, target_layer_ids}`.
"""

from __future__ import annotations

import torch

from evalsuite.catalog import SEED, MethodSpec, Option
from evalsuite.errors import UserError
from evalsuite.methods.base import Method, Proposal, Sampling
from evalsuite.methods.checkpoints import (
    check_fit, detect_method, drafter_source, load_checkpoint, load_weights, read_config, resolve_checkpoint_dir,
)
from evalsuite.methods.draft_layers import (
    ContextCacheMethod, FusedContextBackbone, default_layer_config, default_mask_token_id, evenly_spaced_zlab,
    init_random_, materialize, qwen3_config, require,
)
from evalsuite.methods.dspark import (
    DeepSpecMethod, build_deepspec, default_feature_layers, has_dspark_heads, random_dspark_layout,
)


SPEC = MethodSpec(
    "dflash", "DFlash: parallel block drafter over a draft KV cache (z-lab b16 or DeepSpec block7 layout)", True,
    {"layout": Option(str, "random init: zlab | block7", lambda v: v in ("zlab", "block7"), "choose zlab or block7"),
     "seed": SEED},
    windowable=True, batched=True,
    not_in={"vllm": "vLLM's dflash loads DFlashQwen3/Laguna drafters for Qwen3-family targets only, not our "
                    "DFlashDraftModel checkpoint for a Llama target"})


ZLAB_BLOCK = 16
ZLAB_LAYERS = 5
RANDOM_SEED = 0
LAYOUTS = ("zlab", "block7")


class ZLabDFlashMethod(ContextCacheMethod):
    name = "dflash"

    def __init__(self, target, model: FusedContextBackbone, block_size: int, mask_token_id: int,
                 layer_ids: tuple[int, ...], provenance: dict):
        super().__init__(model, target.embed_tokens, block_size, mask_token_id, layer_ids, target.device)
        self.lm_head = target.lm_head
        self.provenance = provenance

    @torch.inference_mode()
    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Proposal:
        outputs = self.block_outputs()
        masks = outputs[1: 1 + min(k, self.block_size - 1)]  # slot k (position a+k) → token at a+k
        return Proposal(tokens=self.lm_head(masks).argmax(dim=-1))

    def describe(self) -> dict:
        return {**super().describe(), **self.provenance, "layout": "zlab", "block_size": self.block_size,
                "mask_token_id": self.mask_token_id, "slots_predict": "masks only (slot k → position a+k)",
                "embed_tokens": "target", "lm_head": "target", "draft_sampling": "greedy"}


class DeepSpecDFlashMethod(DeepSpecMethod):
    """DeepSpec's block7 DFlash: the DSpark model without Markov and confidence heads."""

    name = "dflash"

    def describe(self) -> dict:
        return {**super().describe(), "layout": "block7"}


def _zlab_settings(config: dict, who: str) -> tuple[int, int, tuple[int, ...], int | None]:
    dflash = config.get("dflash_config")
    require(isinstance(dflash, dict), who, "config.json lacks the 'dflash_config' object")
    require("block_size" in config, who, "config.json lacks 'block_size'")
    require("mask_token_id" in dflash, who, "dflash_config lacks 'mask_token_id'")
    layers = config.get("num_target_layers")
    if "target_layer_ids" in dflash:
        ids = tuple(int(j) for j in dflash["target_layer_ids"])
    else:  # z-lab's fallback: its rule with the *draft* depth as the count
        require(layers is not None, who, "config.json has neither dflash_config.target_layer_ids nor num_target_layers")
        ids = tuple(evenly_spaced_zlab(int(layers), int(config.get("num_hidden_layers", 1))))
    block = int(config["block_size"])
    require(block >= 2, who, f"block_size must be >= 2 (anchor + masks), got {block}")
    return block, int(dflash["mask_token_id"]), ids, None if layers is None else int(layers)


def build_zlab(target, options: dict, source: str | None) -> ZLabDFlashMethod:
    if source is None:
        cfg = default_layer_config(target, ZLAB_LAYERS)
        ids = default_feature_layers(target)
        model = materialize(lambda: FusedContextBackbone(cfg, len(ids)), target.device, target.dtype)
        init_random_(model, int(options.get("seed", RANDOM_SEED)))
        mask, how = default_mask_token_id(target)
        drafter = ZLabDFlashMethod(target, model, ZLAB_BLOCK, mask, ids,
                                   {"weights": "random-init", "layers": ZLAB_LAYERS, "mask_token": how})
        drafter.use_window(options.get("window"))
        return drafter
    checkpoint = load_checkpoint(source, "dflash")
    who = f"dflash drafter {source}"
    block, mask, ids, num_target_layers = _zlab_settings(checkpoint.config, who)
    cfg = qwen3_config(checkpoint.config, who)
    check_fit(target, who, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size, layer_ids=ids,
              num_target_layers=num_target_layers, mask_token_id=mask, trained_for=checkpoint.trained_for)
    state = checkpoint.state_dict(target.device, target.dtype)
    model = materialize(lambda: FusedContextBackbone(cfg, len(ids)), target.device, target.dtype)
    load_weights(model, state, who)
    drafter = ZLabDFlashMethod(target, model, block, mask, ids,
                                {"weights": "checkpoint", "layers": cfg.num_hidden_layers})
    drafter.checkpoint_path, drafter.checkpoint_hash = str(checkpoint.path), checkpoint.sha256
    drafter.use_window(options.get("window"))
    return drafter


def recognises(config: dict) -> bool:
    """A released DFlash checkpoint (docs/methods.md §3.2): z-lab `DFlashDraftModel` with a nested `dflash_config`
    (a SpecForge port of another method, by its `projector_type`, is refused), or DeepSpec's `Qwen3DSparkModel`
    without DSpark's heads (the `*_block7` layout)."""
    architectures = [str(a) for a in config.get("architectures") or []]
    if "DFlashDraftModel" in architectures or "dflash_config" in config:
        projector = (config.get("dflash_config") or {}).get("projector_type")
        if projector not in (None, "dflash"):
            raise UserError(f"drafter config: SpecForge '{projector}' ports are not supported; use the official "
                            "release of that method")
        return True
    return "Qwen3DSparkModel" in architectures and not has_dspark_heads(config)


def build(target, options: dict) -> Method:
    source = drafter_source("dflash", options, target)
    if source is None:
        layout = str(options.get("layout", "zlab"))
        if layout not in LAYOUTS:
            raise UserError(f"dflash layout '{layout}': choose one of {', '.join(LAYOUTS)}")
        if layout == "block7":
            return build_deepspec(target, options, "dflash", DeepSpecDFlashMethod,
                                  lambda t: random_dspark_layout(t, markov_rank=0))
        return build_zlab(target, options, None)
    config = read_config(resolve_checkpoint_dir(source))
    if detect_method(config) == "dflash" and "Qwen3DSparkModel" in (config.get("architectures") or []):
        return build_deepspec(target, options, "dflash", DeepSpecDFlashMethod, random_dspark_layout)
    return build_zlab(target, options, source)
