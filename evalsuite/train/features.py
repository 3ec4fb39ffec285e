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
`hidden.npy` [N, S, H] fp16 (memory-mapped). The pass runs in work units (a sequence plus the sequences that
are prefixes of it) and records the units done in `progress.json`, so an interrupted build resumes where it
stopped and gives the same cache as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
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
    # a work unit longer than this runs alone, this many tokens at a time over the target's KV cache (long agent
    # contexts: bounded memory at any length); shorter ones are batched as above
    chunk_tokens: int = 2048
    # "all": the target's greedy token and top-K at every stored position; "reply": only where the recipes read
    # them (the last prompt position, which predicts the first reply token, and the reply), 0 elsewhere. With a
    # 150k-token vocabulary the lm_head over long stored contexts costs more than it is worth.
    labels: str = "all"


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
    labels: str = "all"  # see FeatureSpec


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

    def fingerprint(self) -> str:
        """Identifies the cache's contents (its meta.json): keys memos of work done over it."""
        return (self.directory / "meta.json").read_text()


class _Joined:
    """Rows of several memory-mapped arrays read as one: `[lo:hi]` and `[lo:hi, cols]` within one part."""

    def __init__(self, parts: list, starts: list[int]):
        self.parts, self.starts = parts, starts  # starts[k]: the first global row of parts[k]; starts[-1] = total

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, key):
        rows, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError("a joined feature cache is read by row ranges [lo:hi] only")
        lo, hi, _ = rows.indices(len(self))
        k = int(np.searchsorted(self.starts, lo, side="right")) - 1
        k = min(k, len(self.parts) - 1)
        if hi > self.starts[k + 1]:
            raise IndexError(f"rows {lo}:{hi} cross two joined feature caches")
        local = slice(lo - self.starts[k], hi - self.starts[k])
        return self.parts[k][(local, *rest)]


class JoinedCache(FeatureCache):
    """Several finished caches of one target read as one (`evalsuite train --extra-cache`): sequences are numbered
    part after part. The parts must agree on everything a recipe reads besides the data (target, layers, top-K,
    sizes, labels, max_seq_len); the first disagreement is a one-line error naming the field."""

    _SAME = ("version", "target_sha256", "layers", "topk", "hidden_size", "vocab_size", "num_target_layers",
             "max_seq_len", "labels")

    def __init__(self, parts: list[FeatureCache]):
        first = parts[0]
        for other in parts[1:]:
            for name in self._SAME:
                a, b = getattr(first.meta, name), getattr(other.meta, name)
                if a != b:
                    raise UserError(f"--extra-cache {other.directory}: its feature cache has {name}={b}, the work "
                                    f"dir's has {name}={a}; join only caches built alike")
        self.parts = parts
        self.directory = first.directory
        totals = {k: sum(getattr(p.meta, k) for p in parts) for k in ("num_sequences", "num_tokens",
                                                                       "num_response_tokens")}
        joined_sha = hashlib.sha256("|".join(p.meta.data_sha256 for p in parts).encode()).hexdigest()
        self.meta = FeatureMeta(**{**asdict(first.meta), **totals, "data_sha256": joined_sha})
        starts = [0]
        for p in parts:
            starts.append(starts[-1] + int(p.offsets[-1]))
        self.offsets = np.concatenate([parts[0].offsets[:1]] + [p.offsets[1:] + s for p, s in zip(parts, starts)])
        self.prompt_lens = np.concatenate([p.prompt_lens for p in parts])
        for name in ("tokens", "greedy", "topk_ids", "topk_probs", "hidden"):
            setattr(self, name, _Joined([getattr(p, name) for p in parts], starts))

    def fingerprint(self) -> str:
        return "\n".join(p.fingerprint() for p in self.parts)


def _data_hash(sequences: list[Sequence]) -> str:
    digest = hashlib.sha256()
    for seq in sequences:
        digest.update(np.asarray(seq.ids, dtype=np.int32).tobytes())
        digest.update(b"|")
    return digest.hexdigest()


def share_prefixes(sequences: list[list[int]], key_tokens: int = 32) -> list[tuple[int, tuple[int, ...]]]:
    """Work units of the feature pass: (host, members), where every member's tokens are a prefix of the host's
    (the host is a member of its own unit). A causal target's states at a position depend only on the tokens up
    to it, so one forward over the host serves every member. Agent contexts cut from one trajectory are prefixes
    of its later cuts (context + logged reply, then more turns), so a trajectory costs one pass over its longest
    cut instead of one per cut. Units are ordered by their first member, deterministically."""
    arrays = [np.asarray(ids, dtype=np.int64) for ids in sequences]
    hosts: dict[bytes, list[int]] = {}
    host_of: dict[int, int] = {}
    for i in sorted(range(len(arrays)), key=lambda i: (-len(arrays[i]), i)):
        ids = arrays[i]
        key = ids[:key_tokens].tobytes()
        for h in hosts.get(key, []):
            if np.array_equal(arrays[h][:len(ids)], ids):
                host_of[i] = h
                break
        else:
            hosts.setdefault(key, []).append(i)
            host_of[i] = i
    members: dict[int, list[int]] = {}
    for i in range(len(arrays)):
        members.setdefault(host_of[i], []).append(i)
    return sorted(((h, tuple(m)) for h, m in members.items()), key=lambda unit: unit[1][0])


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)  # atomic: a pass stopped at any moment leaves a readable progress file


def build_features(target, sequences: list[Sequence], directory: Path, spec: FeatureSpec,
                   target_sha256: str, progress: Callable[[int, int], None] = lambda seqs, tokens: None
                   ) -> FeatureCache:
    """Run the teacher-forced pass (or resume it) and return the finished cache.

    The pass runs in work units (`share_prefixes`): a unit whose host is at most `chunk_tokens` long is batched
    with its neighbours (right-padded, up to `batch_tokens`); a longer one runs alone, `chunk_tokens` at a time
    over the target's KV cache, so memory stays bounded at any context length. After every batch or long unit
    the arrays are flushed and `progress.json` records the units done (written atomically), so a stopped pass
    resumes at the next unit and gives the same cache as an uninterrupted one."""
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
        max_seq_len=spec.max_seq_len, labels=spec.labels,
    )
    if spec.labels not in ("all", "reply"):
        raise UserError(f"feature labels {spec.labels!r}: choose all or reply")
    meta_path, progress_path = directory / "meta.json", directory / "progress.json"
    state = {"done": 0, "units": 0, "first": 0}
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if asdict(FeatureMeta(**old)) != asdict(meta):  # fields added later compare at their defaults
            raise UserError(f"{directory}: a feature cache for other data, target or layers is already there; "
                            "delete it or choose another --work-dir")
        saved = json.loads(progress_path.read_text())
        # a pass begun before work units wrote sequences 0 … done-1 in order: plan the rest from there
        state = {"done": saved["done"], "units": saved.get("units", 0), "first": saved.get("first", saved["done"])}
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
        _write_json(progress_path, state)
        meta_path.write_text(json.dumps(asdict(meta), indent=1))
    first = state["first"]
    units = [(first + h, tuple(first + m for m in members))
             for h, members in share_prefixes([s.ids for s in sequences[first:]])]
    writer = _Writer(target, spec, directory, sequences, cuts, full, offsets)
    u = state["units"]
    with torch.inference_mode():
        while u < len(units):
            if full[units[u][0]] > spec.chunk_tokens:
                batch = [units[u]]
                writer.chunked(units[u])
            else:
                batch = [units[u]]
                width = full[units[u][0]]
                while (u + len(batch) < len(units) and full[units[u + len(batch)][0]] <= spec.chunk_tokens
                       and max(width, full[units[u + len(batch)][0]]) * (len(batch) + 1) <= spec.batch_tokens):
                    width = max(width, full[units[u + len(batch)][0]])
                    batch.append(units[u + len(batch)])
                writer.batched(batch)
            writer.flush()
            u += len(batch)
            members = [m for _, ms in batch for m in ms]
            state = {"done": state["done"] + len(members), "units": u, "first": first}
            _write_json(progress_path, state)
            progress(len(members), sum(lengths[m] for m in members))
    return FeatureCache(directory)


class _Writer:
    """Computes and stores the features of work units (see `build_features`)."""

    HEAD_ROWS = 512  # lm_head rows at a time: a 150k-token vocabulary makes [rows, V] fp32 logits large

    def __init__(self, target, spec: FeatureSpec, directory: Path, sequences: list[Sequence], cuts: list[int],
                 full: list[int], offsets: np.ndarray):
        self.target, self.spec, self.sequences = target, spec, sequences
        self.cuts, self.full, self.offsets = cuts, full, offsets
        self.arrays = {name: np.load(directory / f"{name}.npy", mmap_mode="r+")
                       for name in ("greedy", "topk_ids", "topk_probs", "hidden")}

    def flush(self) -> None:
        for array in self.arrays.values():
            array.flush()

    def _store(self, member: int, lo: int, hi: int, out, row: int, rows: torch.Tensor) -> None:
        """Store positions lo … hi-1 of `member`, found at `rows` of batch row `row` of the forward's states."""
        states = torch.stack([out.hidden_states[j + 1][row, rows] for j in self.spec.layers], dim=1)  # [n, S, H]
        at = int(self.offsets[member]) + lo - self.cuts[member]
        n = hi - lo
        self.arrays["hidden"][at:at + n] = states.to(torch.float16).cpu().numpy()
        first = 0  # the first of these positions that gets labels
        if self.spec.labels == "reply":
            first = min(max(len(self.sequences[member].prompt_ids) - 1 - lo, 0), n)
        last = out.last_hidden_state[row, rows[first:]]
        at, n = at + first, n - first
        for s in range(0, n, self.HEAD_ROWS):
            logits = self.target.lm_head(last[s:s + self.HEAD_ROWS]).float()
            top_p, top_i = torch.softmax(logits, dim=-1).topk(self.spec.topk, dim=-1)
            k = slice(at + s, at + s + logits.shape[0])
            self.arrays["greedy"][k] = logits.argmax(-1).to(torch.int32).cpu().numpy()
            self.arrays["topk_ids"][k] = top_i.to(torch.int32).cpu().numpy()
            self.arrays["topk_probs"][k] = top_p.to(torch.float16).cpu().numpy()

    def batched(self, units: list[tuple[int, tuple[int, ...]]]) -> None:
        # Right padding needs no attention mask: causal attention never lets a real position see the pad.
        device = self.target.device
        width = max(self.full[h] for h, _ in units)
        ids = torch.zeros((len(units), width), dtype=torch.long, device=device)
        for row, (host, _) in enumerate(units):
            ids[row, : self.full[host]] = torch.tensor(self.sequences[host].ids, device=device)
        out = self.target.model.model(input_ids=ids, output_hidden_states=True, use_cache=False)
        for row, (_, members) in enumerate(units):
            for m in members:
                lo, hi = self.cuts[m], self.full[m]
                self._store(m, lo, hi, out, row, torch.arange(lo, hi, device=device))

    def chunked(self, unit: tuple[int, tuple[int, ...]]) -> None:
        host, members = unit
        device, chunk = self.target.device, self.spec.chunk_tokens
        ids = torch.tensor(self.sequences[host].ids, device=device).view(1, -1)
        end = max(self.full[m] for m in members)  # = the host's length
        cache = self.target.new_cache()
        cache.reserve(end)
        for s in range(0, end, chunk):
            e = min(s + chunk, end)
            out = self.target.model.model(input_ids=ids[:, s:e], cache=cache, use_cache=True,
                                          output_hidden_states=True)
            for m in members:
                lo, hi = max(s, self.cuts[m]), min(e, self.full[m])
                if lo < hi:
                    self._store(m, lo, hi, out, 0, torch.arange(lo - s, hi - s, device=device))
