"""Drafters matched to their target: with no --drafter a learned method loads the shipped drafter whose recorded
target weights hash is the target's (the default target's in baselines/drafters/<method>/, another embedded
target's in baselines/drafters/<key>/<method>/); a drafter trained for another target is refused in one line, also
when its shapes fit."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from evalsuite.errors import UserError
from evalsuite.methods import checkpoints
from evalsuite.methods.base import get_method
from evalsuite.methods.checkpoints import drafter_source, shipped_default, trained_for
from evalsuite.target import embedded
from evalsuite.target.model import TargetModel, weights_hash
from evalsuite.testing import build_tiny_target
from tests.helpers import dlite_checkpoint

SHAPES = SimpleNamespace(hidden_size=64, vocab_size=260, num_layers=4)


def record(directory, sha: str, name: str = "some target") -> None:
    (directory / "training_report.json").write_text(json.dumps({"target": name, "target_sha256": sha}))


@pytest.fixture()
def shipped(tmp_path, monkeypatch):
    root = tmp_path / "drafters"
    monkeypatch.setattr(checkpoints, "DEFAULT_DRAFTER_ROOT", root)
    return root


def test_the_shipped_drafter_is_the_one_trained_for_this_target(tiny_llama_dir, tiny_qwen3_dir, shipped):
    llama = TargetModel.load(str(tiny_llama_dir))
    qwen = TargetModel.load(str(tiny_qwen3_dir))
    record(dlite_checkpoint(shipped / "dlite", SHAPES), weights_hash(str(tiny_llama_dir)))
    record(dlite_checkpoint(shipped / "other-target" / "dlite", SHAPES), weights_hash(str(tiny_qwen3_dir)))
    assert drafter_source("dlite", {}, llama) == str(shipped / "dlite")
    assert drafter_source("dlite", {}, qwen) == str(shipped / "other-target" / "dlite")
    assert drafter_source("dlite", {}) == str(shipped / "dlite")  # no target: as before
    assert drafter_source("dlite", {"drafter": "some/dir"}, qwen) == "some/dir"  # --drafter wins
    # each loads on its own target; the other target's is refused although every shape fits
    for target in (llama, qwen):
        drafter = get_method("dlite").factory(target, {})
        assert drafter.checkpoint_path == drafter_source("dlite", {}, target)
    with pytest.raises(UserError) as err:
        get_method("dlite").factory(qwen, {"drafter": str(shipped / "dlite")})
    message = str(err.value)
    assert "\n" not in message and "trained for another target (some target, weights sha256" in message
    assert weights_hash(str(tiny_llama_dir))[:12] in message and weights_hash(str(tiny_qwen3_dir))[:12] in message


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory):
    return build_tiny_target(tmp_path_factory.mktemp("deep") / "t", "llama", layers=8)  # every layer rule fits


@pytest.mark.parametrize("method", ["dlite", "dflash", "dspark", "eagle3"])
def test_every_learned_method_refuses_a_drafter_trained_for_another_target(method, deep_dir, tmp_path):
    """A real (tiny) drafter of each method, written by its training recipe's export, with the report saying it
    was trained for another target: refused in one line; with this target's hash it loads."""
    from evalsuite.train.recipes import dflash, dlite, dspark, eagle3

    target = TargetModel.load(str(deep_dir))
    directory = tmp_path / method
    _export_random(method, target, directory, {"dlite": dlite, "dflash": dflash, "dspark": dspark,
                                               "eagle3": eagle3}[method])
    record(directory, "f" * 64, "Another/Model")
    with pytest.raises(UserError, match=r"^" + method + r" drafter .*: drafter was trained for another target "
                                        r"\(Another/Model, weights sha256 ffffffffffff…\), this target's is"):
        get_method(method).factory(target, {"drafter": str(directory)})
    record(directory, weights_hash(str(deep_dir)))
    assert get_method(method).factory(target, {"drafter": str(directory)}).checkpoint_path == str(directory)


def _export_random(method: str, target, directory, recipe_module) -> None:
    """A drafter in the method's released format, as `evalsuite train` writes it (random weights)."""
    import numpy as np

    from evalsuite.train.features import FeatureSpec, build_features
    from evalsuite.train.generate import Sequence
    from evalsuite.train.pipeline import build_recipe
    from evalsuite.train.recipes.common import recipe_for

    rng = np.random.default_rng(0)
    seqs = [Sequence(f"s{i}", rng.integers(3, 250, 12).tolist(), rng.integers(3, 250, 10).tolist(), "length")
            for i in range(4)]
    options_cls, rule = recipe_for(method).options_type, recipe_for(method).feature_layers
    small = {"dlite": dict(rank=4, intermediate_size=32, head_warm_start_steps=0, single_stage=True),
             "dflash": dict(intermediate_size=32), "dspark": dict(intermediate_size=32, markov_rank=2),
             "eagle3": dict(intermediate_size=32, draft_vocab_size=64)}[method]
    options = options_cls(**small)
    cache = build_features(target, seqs, directory.parent / f"{method}-features",
                           FeatureSpec(rule(target.num_layers, options), topk=4), "sha")
    build_recipe(method, target, cache, options, list(range(4))).export(directory)


def test_a_drafter_without_a_recorded_target_is_checked_by_shapes_only(tiny_llama_dir, tmp_path):
    target = TargetModel.load(str(tiny_llama_dir))
    checkpoint = dlite_checkpoint(tmp_path / "released", SHAPES)  # e.g. a released checkpoint from elsewhere
    assert trained_for(checkpoint) is None
    assert get_method("dlite").factory(target, {"drafter": str(checkpoint)}).checkpoint_path == str(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps(config | {"target_sha256": "e" * 64}))
    assert trained_for(checkpoint).sha256 == "e" * 64  # config.json may carry it too
    with pytest.raises(UserError, match="trained for another target"):
        get_method("dlite").factory(target, {"drafter": str(checkpoint)})


def test_an_embedded_target_without_a_matching_drafter_looks_in_its_own_directory(tiny_llama_dir, shipped):
    qwen_coder = embedded.EMBEDDED[embedded.QWEN_CODER_KEY]
    target = SimpleNamespace(name=qwen_coder.name, model_dir=str(tiny_llama_dir))
    record(dlite_checkpoint(shipped / "dlite", SHAPES), "0" * 64)
    assert shipped_default("dlite", target) == shipped / "qwen2.5-coder-0.5b" / "dlite"
    with pytest.raises(UserError, match=r"^method dlite: no --drafter given and no shipped default in "
                                        r"baselines/drafters/qwen2\.5-coder-0\.5b/dlite/; pass --drafter dlite=DIR"):
        drafter_source("dlite", {}, target)


def test_the_default_targets_shipped_drafters_record_its_hash():
    """The shipped default drafters carry the default target's hash (what matching them needs) and the default
    target's name; no other embedded target's directory claims them."""
    root = checkpoints.DEFAULT_DRAFTER_ROOT
    default = embedded.EMBEDDED[embedded.DEFAULT_KEY]
    for method in ("dlite", "eagle3", "dflash", "dspark"):
        found = trained_for(root / method)
        assert found is not None and found.name == default.name and len(found.sha256) == 64
