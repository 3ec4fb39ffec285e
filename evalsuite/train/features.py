"""Target features computed once, stored on disk in fp16, and shared by every drafter recipe.

One teacher-forced pass of the target over each training sequence (prompt + regenerated reply) records, at
every position i:
- `hidden[i, s]`: the target hidden state of layer `layers[s]` (HF convention: layer j → hidden_states[j+1], so
  the last layer is the post-final-norm state), fp16;
- `greedy[i]`: the target's greedy next token (argmax of its logits at i): the CE label at position i+1;
- `topk_ids[i]`, `topk_probs[i]`: the target's K most likely next tokens and their probabilities (fp16): the
  target distribution the KL/TV/soft-CE losses compare with, truncated to its top K (renormalised).
Storing the top K (K=32 by default) instead of recomputing lm_head from the last hidden state at train time
saves one V×H matrix product per trained position; at K=32 the truncated mass is small for a 135M model.

Layout of a cache directory: `meta.json`, `tokens.npy` [N] int32, `offsets.npy` [n+1] int64,
`prompt_lens.npy` [n] int32, `greedy.npy` [N] int32, `topk_ids.npy` [N, K] int32, `topk_probs.npy` [N, K] fp16,
`hidden.npy` [N, S, H] fp16 (memory-mapped). The pass writes sequences in order and records how many are done
in `progress.json`, so an interrupted build resumes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from evalsuite.errors import UserError
from evalsuite.train.generate import Sequence

FORMAT_VERSION = 1


@dataclass(frozen=True)
class FeatureSpec:
    layers: tuple[int, ...]
    topk: int = 32
    batch_tokens: int = 2048  # tokens per teacher-forced batch
    # > 0: store only the last max_seq_len positions of each sequence (its reply always whole); the target still
    # runs over the full context, so the stored features are the long-context ones. Bounds the cache for 2k-8k
    # token agent contexts (about 6 kB per stored position at 5 layers of SmolLM2).
    max_seq_len: int = 0


@dataclass
class FeatureMeta:
    version: int
    target: str
    target_sha256: str
    layers: list[int]
    topk: int
    hidden_size: int
    vocab_size: int
    num_target_layers: int
    num_sequences: int
    num_tokens: int
    num_response_tokens: int
    data_sha256: str
    max_seq_len: int = 0  # see FeatureSpec; 0 = whole sequences


class FeatureCache:
    """Read access to a finished cache; arrays are memory-mapped, so opening is instant."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        meta_path = self.directory / "meta.json"
        if not meta_path.exists():
            raise UserError(f"{directory}: no feature cache here (meta.json missing); build it first")
        self.meta = FeatureMeta(**json.loads(meta_path.read_text()))
        progress = json.loads((self.directory / "progress.json").read_text())
        if progress["done"] != self.meta.num_sequences:
            raise UserError(f"{directory}: the feature pass stopped at {progress['done']}/{self.meta.num_sequences} "
                            "sequences; rerun the same train command to resume it")
        load = lambda name: np.load(self.directory / name, mmap_mode="r")  # noqa: E731
        self.tokens = load("tokens.npy")
        self.offsets = np.load(self.directory / "offsets.npy")
        self.prompt_lens = np.load(self.directory / "prompt_lens.npy")
        self.greedy = load("greedy.npy")
        self.topk_ids = load("topk_ids.npy")
        self.topk_probs = load("topk_probs.npy")
        self.hidden = load("hidden.npy")

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(self.meta.layers)

    def layer_index(self, wanted: tuple[int, ...] | list[int], who: str) -> list[int]:
        missing = [j for j in wanted if j not in self.meta.layers]
        if missing:
            raise UserError(f"{who} reads target layers {missing}, the feature cache holds {self.meta.layers}; "
                            "rebuild it with those layers (delete the cache directory)")
        return [self.meta.layers.index(j) for j in wanted]

    def __len__(self) -> int:
        return self.meta.num_sequences

    def span(self, seq: int) -> tuple[int, int, int]:
        """(start, prompt_end, end) token offsets of sequence `seq` in the flat arrays."""
        start, end = int(self.offsets[seq]), int(self.offsets[seq + 1])
        return start, start + int(self.prompt_lens[seq]), end


def _data_hash(sequences: list[Sequence]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for seq in sequences:
        digest.update(np.asarray(seq.ids, dtype=np.int32).tobytes())
        digest.update(b"|")
    return digest.hexdigest()


def build_features(target, sequences: list[Sequence], directory: Path, spec: FeatureSpec,
                   target_sha256: str, progress: Callable[[int, int], None] = lambda seqs, tokens: None
                   ) -> FeatureCache:
    """Run the teacher-forced pass (or resume it) and return the finished cache."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target.check_layer_ids(tuple(spec.layers), "the feature cache")
    full = [len(s.ids) for s in sequences]
    cuts = [min(max(n - spec.max_seq_len, 0), len(s.prompt_ids)) if spec.max_seq_len > 0 else 0
            for n, s in zip(full, sequences)]
    lengths = [n - c for n, c in zip(full, cuts)]  # stored positions per sequence
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    total = int(offsets[-1])
    meta = FeatureMeta(
        version=FORMAT_VERSION, target=target.name, target_sha256=target_sha256, layers=list(spec.layers),
        topk=spec.topk, hidden_size=target.hidden_size, vocab_size=target.vocab_size,
        num_target_layers=target.num_layers, num_sequences=len(sequences), num_tokens=total,
        num_response_tokens=sum(len(s.response_ids) for s in sequences), data_sha256=_data_hash(sequences),
        max_seq_len=spec.max_seq_len,
    )
    meta_path, progress_path = directory / "meta.json", directory / "progress.json"
    done = 0
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if old != asdict(meta):
            raise UserError(f"{directory}: a feature cache for other data, target or layers is already there; "
                            "delete it or choose another --work-dir")
        done = json.loads(progress_path.read_text())["done"]
    else:
        np.save(directory / "tokens.npy", np.concatenate([np.asarray(s.ids[c:], dtype=np.int32)
                                                          for s, c in zip(sequences, cuts)]))
        np.save(directory / "offsets.npy", offsets)
        np.save(directory / "prompt_lens.npy", np.asarray([len(s.prompt_ids) - c for s, c in zip(sequences, cuts)],
                                                          dtype=np.int32))
        S, H, K = len(spec.layers), target.hidden_size, spec.topk
        for name, shape, dtype in (("greedy.npy", (total,), np.int32), ("topk_ids.npy", (total, K), np.int32),
                                   ("topk_probs.npy", (total, K), np.float16),
                                   ("hidden.npy", (total, S, H), np.float16)):
            np.lib.format.open_memmap(directory / name, mode="w+", dtype=dtype, shape=shape).flush()
        progress_path.write_text(json.dumps({"done": 0}))
        meta_path.write_text(json.dumps(asdict(meta), indent=1))
    arrays = {name: np.load(directory / f"{name}.npy", mmap_mode="r+")
              for name in ("greedy", "topk_ids", "topk_probs", "hidden")}
    body = target.model.model
    head = target.lm_head
    pad = 0
    with torch.inference_mode():
        while done < len(sequences):
            batch = [done]
            width = full[done]
            while (batch[-1] + 1 < len(sequences)
                   and max(width, full[batch[-1] + 1]) * (len(batch) + 1) <= spec.batch_tokens):
                batch.append(batch[-1] + 1)
                width = max(width, full[batch[-1]])
            # Right padding needs no attention mask: causal attention never lets a real position see the pad.
            ids = torch.full((len(batch), width), pad, dtype=torch.long, device=target.device)
            for row, seq in enumerate(batch):
                ids[row, : full[seq]] = torch.tensor(sequences[seq].ids, device=target.device)
            out = body(input_ids=ids, output_hidden_states=True, use_cache=False)
            for row, seq in enumerate(batch):
                lo, hi, start = cuts[seq], full[seq], int(offsets[seq])  # stored positions lo..hi of the sequence
                states = torch.stack([out.hidden_states[j + 1][row, lo:hi] for j in spec.layers], dim=1)  # [n, S, H]
                logits = head(out.last_hidden_state[row, lo:hi]).float()
                top_p, top_i = torch.softmax(logits, dim=-1).topk(spec.topk, dim=-1)
                n = hi - lo
                arrays["hidden"][start:start + n] = states.to(torch.float16).cpu().numpy()
                arrays["greedy"][start:start + n] = logits.argmax(-1).to(torch.int32).cpu().numpy()
                arrays["topk_ids"][start:start + n] = top_i.to(torch.int32).cpu().numpy()
                arrays["topk_probs"][start:start + n] = top_p.to(torch.float16).cpu().numpy()
            for array in arrays.values():
                array.flush()
            done = batch[-1] + 1
            progress_path.write_text(json.dumps({"done": done}))
            progress(len(batch), sum(lengths[s] for s in batch))
    return FeatureCache(directory)
