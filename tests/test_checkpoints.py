"""Shared drafter-checkpoint helpers: method detection, resolution (local / hub offline), safetensors-only
loading (also sharded), strict key matching, the shipped-default directory."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from evalsuite.errors import UserError
from evalsuite.methods import checkpoints
from evalsuite.methods.checkpoints import (
    detect_method, drafter_source, load_checkpoint, load_state_dict, load_weights, resolve_checkpoint_dir,
)
from evalsuite.target.model import weights_hash


@pytest.mark.parametrize("config, method", [
    ({"architectures": ["DLiteDraftModel"], "dlite_config": {}}, "dlite"),
    ({"architectures": ["Qwen3ForCausalLM"], "dlite_config": {}}, "dlite"),
    ({"architectures": ["DFlashDraftModel"], "dflash_config": {"mask_token_id": 1}}, "dflash"),
    ({"architectures": ["Qwen3DSparkModel"], "markov_rank": 256, "enable_confidence_head": True}, "dspark"),
    ({"architectures": ["Qwen3DSparkModel"], "markov_rank": 0, "enable_confidence_head": False}, "dflash"),
    ({"architectures": ["LlamaForCausalLMEagle3"]}, "eagle3"),
    ({"architectures": ["Qwen3Eagle3Model"]}, "eagle3"),
])
def test_detect_method(config, method):
    assert detect_method(config) == method


def test_detect_method_refuses_unknown_and_ports():
    with pytest.raises(UserError, match="cannot tell the method"):
        detect_method({"architectures": ["Qwen3ForCausalLM"]})
    with pytest.raises(UserError, match="SpecForge 'dspark' ports"):
        detect_method({"architectures": ["DSparkDraftModel"], "dflash_config": {"projector_type": "dspark"}})


def _write(directory, tensors, config=None, name="model.safetensors"):
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / name))
    (directory / "config.json").write_text(json.dumps(config or {"architectures": ["DFlashDraftModel"],
                                                                 "dflash_config": {}}))
    return directory


def test_load_checkpoint_reads_sharded_safetensors_and_hashes(tmp_path):
    directory = tmp_path / "sharded"
    _write(directory, {"a": torch.ones(2, dtype=torch.bfloat16)}, name="model-00001-of-00002.safetensors")
    save_file({"b": torch.arange(3)}, str(directory / "model-00002-of-00002.safetensors"))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    checkpoint = load_checkpoint(str(directory), "dflash")
    assert checkpoint.method == "dflash" and checkpoint.sha256 == weights_hash(str(directory))
    state = checkpoint.state_dict(dtype=torch.float32)
    assert state["a"].dtype == torch.float32 and state["b"].dtype == torch.int64  # only floats are converted
    with pytest.raises(UserError, match="is a dflash checkpoint, not dlite"):
        load_checkpoint(str(directory), "dlite")


def test_pickled_weights_are_never_loaded(tmp_path):
    directory = tmp_path / "pickled"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"dlite_config": {}}))
    torch.save({"x": torch.ones(1)}, directory / "pytorch_model.bin")
    with pytest.raises(UserError, match="pickled weights are never loaded"):
        load_state_dict(directory)


def test_resolution_errors_are_one_line(tmp_path):
    with pytest.raises(UserError, match="no such directory"):
        resolve_checkpoint_dir(str(tmp_path / "missing" / "dir"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        resolve_checkpoint_dir(str(tmp_path / "empty"))


def test_hub_id_offline_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match="cannot download from the Hugging Face hub") as err:
        resolve_checkpoint_dir("no-such-org/no-such-drafter")
    assert "\n" not in str(err.value)


def test_strict_weight_loading(tmp_path):
    module = torch.nn.Sequential(torch.nn.Linear(2, 3))
    good = {"0.weight": torch.ones(3, 2), "0.bias": torch.zeros(3)}
    assert load_weights(module, good, "x") == []
    assert torch.equal(module[0].weight, torch.ones(3, 2))
    with pytest.raises(UserError, match="missing 0.bias"):
        load_weights(module, {"0.weight": torch.ones(3, 2)}, "x")
    with pytest.raises(UserError, match="unexpected extra"):
        load_weights(module, good | {"extra": torch.ones(1)}, "x")
    with pytest.raises(UserError, match="shapes disagree"):
        load_weights(module, {"0.weight": torch.ones(2, 2), "0.bias": torch.zeros(3)}, "x")
    assert load_weights(module, {"0.weight": torch.ones(3, 2)}, "x", optional=("0.bias",)) == ["0.bias"]


def test_drafter_source_prefers_option_then_shipped_default(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints, "DEFAULT_DRAFTER_ROOT", tmp_path / "drafters")
    # never a silent random init: no --drafter and no shipped default is a one-line error saying what to pass
    with pytest.raises(UserError, match="no baselines/drafters/.*--drafter dlite=DIR"):
        drafter_source("dlite", {})
    (tmp_path / "drafters" / "dlite").mkdir(parents=True)
    with pytest.raises(UserError, match="no shipped default in baselines/drafters/dlite/"):
        drafter_source("dlite", {})  # an empty placeholder directory is not a checkpoint
    (tmp_path / "drafters" / "dlite" / "config.json").write_text("{}")
    assert drafter_source("dlite", {}) == str(tmp_path / "drafters" / "dlite")
    assert drafter_source("dlite", {"drafter": "org/name"}) == "org/name"
    assert drafter_source("dlite", {"drafter": "random"}) is None
