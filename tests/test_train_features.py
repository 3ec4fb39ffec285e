"""The feature pass: a stopped pass resumes to the same cache as an uninterrupted one; sequences that are prefixes
of another share its forward (long ones in chunks over the KV cache) and get the features of their own pass."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from evalsuite.target.model import TargetModel
from evalsuite.testing import build_tiny_target
from evalsuite.train.features import FeatureCache, FeatureSpec, build_features, share_prefixes
from evalsuite.train.generate import Sequence

ARRAYS = ("tokens", "offsets", "prompt_lens", "greedy", "topk_ids", "topk_probs", "hidden")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    directory = build_tiny_target(tmp_path_factory.mktemp("target") / "t", "llama", layers=4)
    return TargetModel.load(str(directory), weight_layout="row-major")


def sequences() -> list[Sequence]:
    """Short chat-like sequences, and two 'trajectories' whose later cuts extend the earlier ones (context +
    reply, then more turns), some longer than the chunk size."""
    rng = random.Random(0)
    found = []
    for i in range(5):
        prompt = [rng.randrange(3, 250) for _ in range(rng.randrange(4, 12))]
        found.append(Sequence(f"chat-{i}", prompt, [rng.randrange(3, 250) for _ in range(6)] + [2], "eos"))
    for t in range(2):
        trajectory = [rng.randrange(3, 250) for _ in range(150)]
        for cut in (30, 70, 120):  # context = trajectory[:cut], reply = the next 12 tokens
            found.append(Sequence(f"traj-{t}-{cut}", trajectory[:cut], trajectory[cut:cut + 12], "length", "logged"))
    rng.shuffle(found)
    return found


SPEC = dict(topk=8, batch_tokens=96, chunk_tokens=40)


def arrays(directory) -> dict[str, np.ndarray]:
    cache = FeatureCache(directory)
    return {name: np.asarray(getattr(cache, name)) for name in ARRAYS}


def test_prefixes_share_a_host_and_units_cover_every_sequence_once():
    seqs = sequences()
    units = share_prefixes([s.ids for s in seqs])
    members = sorted(m for _, ms in units for m in ms)
    assert members == list(range(len(seqs)))
    hosts = {seqs[h].conv_id for h, _ in units}
    assert {"traj-0-120", "traj-1-120"} <= hosts and not any(h.startswith("traj") and not h.endswith("-120")
                                                             for h in hosts)
    for host, ms in units:
        for m in ms:
            assert seqs[host].ids[:len(seqs[m].ids)] == seqs[m].ids
    assert [ms[0] for _, ms in units] == sorted(ms[0] for _, ms in units)  # ordered by first member


@pytest.mark.parametrize("max_seq_len", [0, 24])
def test_a_stopped_feature_pass_resumes_to_the_same_cache(target, tmp_path, max_seq_len):
    seqs = sequences()
    spec = FeatureSpec((0, 1, 3), max_seq_len=max_seq_len, **SPEC)
    build_features(target, seqs, tmp_path / "whole", spec, "sha")
    calls = {"n": 0}

    class Stop(Exception):
        pass

    def stop_after_two(n, tokens):
        calls["n"] += 1
        if calls["n"] == 2:
            raise Stop

    with pytest.raises(Stop):
        build_features(target, seqs, tmp_path / "resumed", spec, "sha", stop_after_two)
    progress = json.loads((tmp_path / "resumed" / "progress.json").read_text())
    assert 0 < progress["done"] < len(seqs) and progress["units"] >= 2
    with pytest.raises(Exception, match="stopped at"):
        FeatureCache(tmp_path / "resumed")  # an unfinished cache is refused, not read
    seen = []
    build_features(target, seqs, tmp_path / "resumed", spec, "sha", lambda n, tokens: seen.append(n))
    assert sum(seen) == len(seqs) - progress["done"]  # only the rest ran
    whole, resumed = arrays(tmp_path / "whole"), arrays(tmp_path / "resumed")
    for name in ARRAYS:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)


def test_shared_and_chunked_features_match_a_pass_over_each_sequence_alone(target, tmp_path):
    seqs = sequences()
    spec = FeatureSpec((0, 1, 3), max_seq_len=24, **SPEC)
    cache = FeatureCache(build_features(target, seqs, tmp_path / "c", spec, "sha").directory)
    body = target.model.model
    for i, seq in enumerate(seqs):
        start, _, end = cache.span(i)
        with torch.inference_mode():
            out = body(input_ids=torch.tensor([seq.ids]), output_hidden_states=True, use_cache=False)
            greedy = target.lm_head(out.last_hidden_state[0, len(seq.ids) - (end - start):]).argmax(-1)
        lo = len(seq.ids) - (end - start)
        want = torch.stack([out.hidden_states[j + 1][0, lo:] for j in (0, 1, 3)], dim=1)
        got = torch.from_numpy(np.asarray(cache.hidden[start:end], dtype=np.float32))
        torch.testing.assert_close(got, want.to(torch.float16).float(), atol=2e-2, rtol=2e-2)
        assert (torch.from_numpy(np.asarray(cache.greedy[start:end], dtype=np.int64)) == greedy).float().mean() > 0.95
        assert list(cache.tokens[start:end]) == seq.ids[lo:]


def test_reply_labels_are_those_of_the_full_pass_and_the_prompt_gets_none(target, tmp_path):
    seqs = sequences()
    caches = {labels: FeatureCache(build_features(target, seqs, tmp_path / labels, FeatureSpec(
        (0, 1, 3), max_seq_len=24, labels=labels, **SPEC), "sha").directory) for labels in ("all", "reply")}
    every, reply = caches["all"], caches["reply"]
    np.testing.assert_array_equal(np.asarray(reply.hidden), np.asarray(every.hidden))
    for i in range(len(seqs)):
        start, prompt_end, end = every.span(i)
        first = max(prompt_end - 1, start)  # the last prompt position predicts the first reply token
        for name in ("greedy", "topk_ids", "topk_probs"):
            np.testing.assert_array_equal(np.asarray(getattr(reply, name)[first:end]),
                                          np.asarray(getattr(every, name)[first:end]), err_msg=name)
            assert not np.asarray(getattr(reply, name)[start:first]).any(), name
    assert reply.meta.labels == "reply" and every.meta.labels == "all"


def test_joined_caches_read_as_the_cache_of_all_their_sequences(target, tmp_path):
    from evalsuite.errors import UserError
    from evalsuite.train.features import JoinedCache

    seqs = sequences()
    spec = FeatureSpec((1, 3), **SPEC)
    build_features(target, seqs, tmp_path / "all", spec, "sha")
    build_features(target, seqs[:6], tmp_path / "a", spec, "sha")
    build_features(target, seqs[6:], tmp_path / "b", spec, "sha")
    whole, joined = FeatureCache(tmp_path / "all"), JoinedCache([FeatureCache(tmp_path / "a"),
                                                                 FeatureCache(tmp_path / "b")])
    assert len(joined) == len(whole) == len(seqs)
    assert joined.meta.num_tokens == whole.meta.num_tokens
    assert joined.meta.num_response_tokens == whole.meta.num_response_tokens
    for seq in range(len(seqs)):
        assert joined.span(seq) == whole.span(seq)
        start, _, end = joined.span(seq)
        for name in ("tokens", "greedy", "topk_ids", "topk_probs"):
            np.testing.assert_array_equal(getattr(joined, name)[start:end], getattr(whole, name)[start:end])
        np.testing.assert_allclose(joined.hidden[start:end, [1]], whole.hidden[start:end, [1]], atol=2e-3)
    boundary = joined.span(6)[0]
    with pytest.raises(IndexError, match="cross two joined"):
        joined.tokens[boundary - 1:boundary + 1]
    assert joined.meta.data_sha256 != FeatureCache(tmp_path / "a").meta.data_sha256
    assert joined.fingerprint() != FeatureCache(tmp_path / "a").fingerprint()

    build_features(target, seqs[6:], tmp_path / "other", FeatureSpec((1, 2), **SPEC), "sha")
    with pytest.raises(UserError, match=r"has layers=\[1, 2\], the work dir's has layers=\[1, 3\]"):
        JoinedCache([FeatureCache(tmp_path / "a"), FeatureCache(tmp_path / "other")])
