"""Cache-keeping drafters keep their draft KV over the unchanged context prefix across turns, and the result
equals a drafter that rebuilt its cache from scratch."""

from __future__ import annotations

import pytest
import torch

from evalsuite.engines.hf import PrefixCache
from evalsuite.methods.base import Sampling, common_prefix_len, get_method
from evalsuite.target.model import TargetModel
from evalsuite.testing import build_tiny_target


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def deep_target(request, tmp_path_factory):
    """8 layers: deep enough for every method's default layer rule (EAGLE-3's needs 5 distinct ids)."""
    return TargetModel.load(str(build_tiny_target(tmp_path_factory.mktemp("deep") / request.param, request.param,
                                                  layers=8)))


def test_common_prefix_len():
    t = torch.tensor
    assert common_prefix_len(t([1, 2, 3]), t([1, 2, 4, 5])) == 2
    assert common_prefix_len(t([1, 2]), t([1, 2, 3])) == 2
    assert common_prefix_len(t([], dtype=torch.long), t([1])) == 0
    assert common_prefix_len(t([9]), t([1])) == 0


def _features(target, layers, ids):
    prefix = PrefixCache(target, tuple(layers))
    prefix.prefill(ids[:-1] + [ids[-1]])  # features of every position; the anchor's are not used
    return prefix.features[:-1]


@pytest.mark.parametrize("method", ["dflash", "dspark", "eagle3"])
def test_second_turn_reuses_the_prefix_and_matches_a_rebuild(deep_target, method):
    tiny_target = deep_target
    factory = get_method(method).factory
    reused, fresh = factory(tiny_target, {"drafter": "random"}), factory(tiny_target, {"drafter": "random"})
    layers = reused.feature_layers
    turn1 = [1, 40, 41, 42, 43, 44, 45, 46, 47, 48]
    reused.start_turn(torch.tensor(turn1), _features(tiny_target, layers, turn1))
    reused.propose(4, Sampling(), None)
    history_after_turn1 = reused.state_bytes().history
    # turn 2: the old context, a changed tail, and more tokens (as a re-rendered agent context would be)
    turn2 = turn1[:7] + [60, 61, 62, 63, 64, 65, 66]
    features = _features(tiny_target, layers, turn2)
    fused_rows = []
    original_fuse = reused.model.fuse
    reused.model.fuse = lambda rows: fused_rows.append(rows.shape[0]) or original_fuse(rows)
    reused.start_turn(torch.tensor(turn2), features)
    reused.model.fuse = original_fuse
    # only the rows after the common prefix (7 tokens) are recomputed; EAGLE-3's entry i also needs token i+1
    assert sum(fused_rows) == len(turn2) - 1 - (6 if method == "eagle3" else 7)
    fresh.start_turn(torch.tensor(turn2), features)
    a, b = reused.propose(5, Sampling(), None), fresh.propose(5, Sampling(), None)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert reused.state_bytes().history == fresh.state_bytes().history
    assert history_after_turn1 > 0
    assert reused.cache.length == fresh.cache.length
