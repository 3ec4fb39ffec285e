"""`suffix` (SuffixDecoding through arctic-inference): lossless, drafts from the context and from earlier replies,
its draft state grows with the replies seen, options reach run.json, and a missing library is a one-line error."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.methods.ar import AutoregressiveMethod
from evalsuite.methods.base import Sampling
from evalsuite.methods.suffix import SuffixMethod
from tests.helpers import load_turns
from tests.helpers import PROMPTS, decode

cli = CliRunner()
CPU = torch.device("cpu")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_suffix_equals_autoregressive(tiny_target, prompt):
    reference = decode(tiny_target, AutoregressiveMethod(tiny_target.device), prompt, 48)
    drafter = SuffixMethod(tiny_target.device)
    for k in (1, 3, 7):
        result = decode(tiny_target, drafter, prompt, 48, k=k)  # the global tree carries over from k to k
        assert result.output_ids == reference.output_ids, k
    assert sum(s.num_drafted for s in result.steps) > 0


def test_a_pattern_repeated_in_the_prompt_is_drafted():
    pattern = [50, 51, 52, 53, 54, 55, 56, 57, 58, 59]
    drafter = SuffixMethod(CPU, max_spec_factor=2.0)
    drafter.start_turn(torch.tensor([1, 7, 8] + pattern + [9, 9] + pattern[:4]), None)  # anchor = pattern[3]
    drafted = drafter.propose(5, Sampling(), None).tokens.tolist()
    assert drafted == pattern[4:9]
    # after committing two of them the draft continues from the new position
    drafter.commit(torch.tensor(pattern[4:6]), None)
    assert drafter.propose(3, Sampling(), None).tokens.tolist() == pattern[6:9]


def test_max_spec_factor_limits_drafts_to_the_match_length():
    pattern = list(range(60, 80))
    drafter = SuffixMethod(CPU, max_spec_factor=1.0)
    drafter.start_turn(torch.tensor([1] + pattern + [9] + pattern[:2]), None)  # 2-token match → at most 2 drafts
    assert drafter.propose(7, Sampling(), None).tokens.tolist() == pattern[2:4]


def test_the_global_tree_learns_from_earlier_replies(tiny_llama_dir):
    from evalsuite.target.model import TargetModel

    target = TargetModel.load(str(tiny_llama_dir))
    prompt = list(range(4, 40))  # no repetition inside the prompt to draft from
    drafter = SuffixMethod(target.device)
    empty_global = drafter.tree_bytes()[1]
    first = decode(target, drafter, prompt, 48, k=7)
    after_first = drafter.tree_bytes()[1]
    second = decode(target, drafter, prompt, 48, k=7)  # the same request again: its reply is in the global tree
    after_second = drafter.tree_bytes()[1]
    assert second.output_ids == first.output_ids
    drafted = [sum(s.num_drafted for s in r.steps) for r in (first, second)]
    accepted = [sum(s.num_accepted for s in r.steps) for r in (first, second)]
    assert drafted[1] > drafted[0] and accepted[1] > accepted[0], (drafted, accepted)
    assert len(second.steps) < len(first.steps)
    # the state grows with the replies seen, and the recorded history bytes include the global tree
    assert empty_global < after_first < after_second
    assert second.steps[-1].draft_history_bytes >= after_second
    # reset (after the runner's warm-up) forgets every earlier reply
    drafter.reset()
    assert drafter.tree_bytes()[1] == empty_global
    third = decode(target, drafter, prompt, 48, k=7)
    assert sum(s.num_drafted for s in third.steps) == drafted[0]


def test_history_bytes_grow_within_a_turn(tiny_llama_dir):
    from evalsuite.target.model import TargetModel

    target = TargetModel.load(str(tiny_llama_dir))
    result = decode(target, SuffixMethod(target.device), PROMPTS[2], 40, k=3)
    history = [s.draft_history_bytes for s in result.steps]
    assert history == sorted(history) and history[-1] > history[0]


def test_run_records_suffix_options_and_equals_ar(tiny_llama_dir, tmp_path):
    out = tmp_path / "suffix-run"
    result = cli.invoke(app, ["run", "--method", "suffix,ngram,ar", "--task", "mt-bench", "--target",
                              str(tiny_llama_dir), "--limit", "2", "--max-new-tokens", "24", "--k", "5",
                              "--method-option", "suffix.max_spec_factor=2", "--method-option",
                              "suffix.min_token_prob=0.2", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    described = json.loads((out / "run.json").read_text())["drafters"]["suffix"]
    assert described["max_spec_factor"] == 2.0 and described["min_token_prob"] == 0.2
    assert described["max_depth"] == 64 and described["library_version"] == "0.3.0"
    turns = load_turns(out).set_index(["method", "sample_id", "turn"]).sort_index()
    assert [list(o) for o in turns.loc["suffix"].output_ids] == [list(o) for o in turns.loc["ar"].output_ids]


def error_lines(output: str) -> list[str]:
    """The lines a failed run printed, less the target loader's progress bar (the factory runs after loading)."""
    return [line for line in output.strip().splitlines() if line.strip() and "Loading weights" not in line]


@pytest.mark.parametrize("option, message", [
    ("suffix.nosuch=1", "suffix.nosuch: unknown setting; suffix takes: max_cached_requests, max_depth"),
    ("suffix.max_depth=deep", "suffix.max_depth=deep: not a valid int"),
    ("suffix.max_depth=1", "suffix.max_depth=1: must be >= 2"),
    ("suffix.max_dept=32", "did you mean max_depth?"),
    ("ngram.max_ngram=2", "method ngram is not in --method suffix"),
    ("suffix", "write METHOD.KEY=VALUE"),
])
def test_bad_suffix_options_are_one_line_errors(option, message, tiny_llama_dir, tmp_path):
    result = cli.invoke(app, ["run", "--method", "suffix", "--target", str(tiny_llama_dir), "--limit", "1",
                              "--max-new-tokens", "4", "--method-option", option, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(error_lines(result.output)) == 1, result.output


def test_missing_library_is_a_one_line_error(monkeypatch, tiny_llama_dir, tmp_path):
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # makes the import fail
    result = cli.invoke(app, ["run", "--method", "suffix", "--target", str(tiny_llama_dir), "--limit", "1",
                              "--max-new-tokens", "4", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert "arctic-inference==0.3.0" in result.output and "evalsuite[suffix]" in result.output
    assert "Traceback" not in result.output and len(error_lines(result.output)) == 1, result.output
