"""The embedded default target (SmolLM2-135M-Instruct): lossless speculative decoding and a real end-to-end run."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.methods.ar import AutoregressiveMethod
from evalsuite.methods.ngram import PromptLookupMethod
from tests.helpers import load_steps, load_turns
from evalsuite.target.model import TargetModel

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def default_target():
    return TargetModel.load("default")


def test_default_target_greedy_lossless(default_target):
    from tests.helpers import RandomMethod, decode

    messages = [{"role": "user", "content": "Repeat this list twice: apple, banana, cherry, date, elderberry."}]
    prompt = default_target.render(messages)
    reference = decode(default_target, AutoregressiveMethod(default_target.device), prompt, 64)
    for drafter in (PromptLookupMethod(default_target.device), RandomMethod(default_target.vocab_size)):
        result = decode(default_target, drafter, prompt, 64, k=5)
        assert result.output_ids == reference.output_ids, drafter.name
    # and HF generate agrees with our AR loop
    with torch.inference_mode():
        generated = default_target.model.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)
    hf = generated[0, len(prompt):].tolist()
    assert hf == reference.output_ids[: len(hf)]


def test_default_run_end_to_end(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--method", "ngram", "--task", "mt-bench", "--limit", "1",
                                      "--max-new-tokens", "48", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    turns = load_turns(out)
    assert sorted(turns.method) == ["ar", "ar", "ngram", "ngram"]  # `ar` is stored whenever it ran (its pair)
    ngram = turns[turns.method == "ngram"]
    assert (turns.new_tokens > 0).all() and ngram.speedup_turn.notna().all()
    assert len(load_steps(out)) > 0
