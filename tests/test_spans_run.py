"""Span labels of whole runs: the labels the runner stores with each turn = `label_run` on the stored run (parts of
turns and compacted files alike), acceptance by span on a planted run and on a real tiny run (drafted/accepted add
up to the run's totals), the report section, the CLI."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.labelling import label_run
from evalsuite.report.spans import (acceptance_by_span, copy_ratio_by_task, copy_ratio_per_turn, load_spans,
                                    span_paragraph)
from evalsuite.store.run_store import RunStore
from tests.helpers import load_steps, load_turns

cli = CliRunner()
KEYS = ["method", "sample_id", "turn"]


# ---- a planted run: the step → position mapping --------------------------------------------------------------------
def _planted():
    """Two turns of method m. Turn 0 (8 tokens): step 0 drafts 3 and accepts 2 (positions 1, 2 accepted, 3
    rejected); step 1 drafts 2, accepts 0 (4, 5 rejected); step 2 drafts 3, accepts 1 (5 accepted; 6, 7 rejected);
    step 3 is budget-limited. Turn 1 (3 tokens): one step drafts 4 and accepts 1, its bonus ends the turn, so drafts
    aimed at positions 3 and 4 count at the last position (2)."""
    kinds0 = ["prose", "prose", "code", "code", "code", "code", "other", "other"]
    copy0 = [0, 0, 8, 9, 10, 11, 0, 0]  # positions 2-5 copied at threshold 8
    steps = pd.DataFrame([
        ("m", "s", 0, 0, 3, 2, 3, False), ("m", "s", 0, 1, 2, 0, 1, False), ("m", "s", 0, 2, 3, 1, 2, False),
        ("m", "s", 0, 3, 0, 0, 1, True), ("m", "s", 1, 0, 4, 1, 2, False),
        ("ar", "s", 0, 0, 0, 0, 7, False),
    ], columns=["method", "sample_id", "turn", "step", "num_drafted", "num_accepted", "emitted", "budget_limited"])
    steps["task"] = "t"
    turns = pd.DataFrame([("m", "s", 0, 8, "max_new_tokens"), ("m", "s", 1, 3, "eos"), ("ar", "s", 0, 8, "eos"),
                          ("m", "s", 2, 0, "skipped")], columns=[*KEYS, "new_tokens", "stop_reason"])
    turns["task"], turns["context_len"] = "t", 100
    spans = pd.DataFrame([("m", "s", 0, kinds0, copy0), ("m", "s", 1, ["tool_call"] * 3, [0, 0, 0]),
                          ("ar", "s", 0, kinds0, copy0)], columns=[*KEYS, "kind", "copy_len"])
    spans["context_copy_len"] = spans.copy_len
    spans["n_tokens"] = spans.kind.map(len)
    spans["threshold"], spans["skip_reason"] = 8, ""
    return steps, turns, spans


def test_drafts_land_on_the_output_positions_they_aimed_at():
    steps, turns, spans = _planted()
    table = acceptance_by_span(steps, turns, spans).set_index("span")
    assert set(table.method) == {"m"}  # ar drafts nothing and is left out
    # turn 0 drafted positions: 1,2,3 | 4,5 | 5,6,7, accepted 1,2 | - | 5; turn 1: 1,2,2,2, accepted 1.
    # Steps start at 1 (prose, 2 accepted), 4 (code, 0), 5 (code, 1), 7 (other, budget-limited: left out); turn 1: 1
    expected = {  # span: (n_tokens, drafted, accepted, mean accepted of the counted steps starting there)
        "prose": (2, 1, 1, 2.0),
        "code": (4, 5, 2, 0.5),
        "other": (2, 2, 0, float("nan")),
        "tool_call": (3, 4, 1, 1.0),
    }
    for span, (n_tokens, drafted, accepted, per_step) in expected.items():
        row = table.loc[span]
        assert (row.n_tokens, row.drafted, row.accepted) == (n_tokens, drafted, accepted), span
        assert row.mean_accepted_per_step == pytest.approx(per_step, nan_ok=True), span
    assert table.loc["copied"].drafted == 5 and table.loc["copied"].accepted == 2  # positions 2,3,4,5,5
    assert table.loc["all"].drafted == steps[steps.method == "m"].num_drafted.sum() == 12
    assert table.loc["all"].accepted == steps[steps.method == "m"].num_accepted.sum() == 4
    assert table.loc["all"].n_tokens == 11 and table.loc["prose"].share_of_output == pytest.approx(2 / 11)
    assert table.loc["code"].acceptance_per_drafted == pytest.approx(0.4)


def test_labels_that_do_not_fit_the_output_are_not_used():
    steps, turns, spans = _planted()
    spans.loc[spans.turn == 1, "n_tokens"] = 5  # made for another output
    table = acceptance_by_span(steps, turns, spans).set_index("span")
    assert table.loc["all"].drafted == 8  # turn 0 only
    steps.loc[(steps.turn == 0) & (steps.step == 0) & (steps.method == "m"), "emitted"] = 2
    with pytest.raises(Exception, match="emitted"):
        acceptance_by_span(steps, turns, spans)


# ---- a real run on a tiny target, labelled during the run and afterwards -------------------------------------------
CONVERSATION = {"id": "conv", "tools": [{"type": "function", "function": {
    "name": "ls", "description": "list files", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}}}}}], "messages": [
    {"role": "system", "content": "You are an agent. Use tools."},
    {"role": "user", "content": "List the files in src and tell me what is there."},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "ls", "arguments": {"path": "src"}}}]},
    {"role": "tool", "content": "main.py\nutils.py\nREADME.md"},
    {"role": "assistant", "content": "There are three files:\n```bash\nls src\n```"},
    {"role": "user", "content": "Now repeat the list of files exactly."}]}


@pytest.fixture(scope="module")
def labelled_runs(tiny_qwen3_dir, tmp_path_factory):
    """Two runs, labelled by the runner as it decodes: an agent conversation with tools under logged replay (left
    uncompacted: one part per turn group), and mt-bench under free replay (compacted when it finished)."""
    root = tmp_path_factory.mktemp("span-runs")
    data = root / "conv.jsonl"
    data.write_text(json.dumps(CONVERSATION) + "\n")
    runs = {}
    compact = RunStore.compact
    for name, args in {"custom": ["--task", "custom", "--data-path", str(data)],
                       "mt-bench": ["--task", "mt-bench", "--limit", "2"]}.items():
        out = root / name
        RunStore.compact = (lambda self: 0) if name == "custom" else compact
        try:
            result = cli.invoke(app, ["run", "--method", "ngram,ar", *args, "--target", str(tiny_qwen3_dir),
                                      "--max-new-tokens", "24", "--k", "4", "--out", str(out)],
                                catch_exceptions=False)
        finally:
            RunStore.compact = compact
        assert result.exit_code == 0, result.output
        runs[name] = out
    assert len(list((runs["custom"] / "spans.parquet").iterdir())) > 1
    assert [p.name[:8] for p in (runs["mt-bench"] / "spans.parquet").iterdir()] == ["compact-"]
    return runs


def _unlabelled_copy(run, directory):
    shutil.copytree(run, directory, ignore=shutil.ignore_patterns("spans.parquet"))
    return directory


def _same_labels(a, b):
    a, b = (frame.sort_values(KEYS).reset_index(drop=True) for frame in (a, b))
    assert len(a) == len(b) > 0
    for column in ["run_id", *KEYS, "task", "context_len", "context_sha256", "n_tokens", "threshold",
                   "labeller_version", "skip_reason"]:
        assert list(a[column]) == list(b[column]), column
    for column in ["kind", "copy_len", "context_copy_len"]:
        assert [list(x) for x in a[column]] == [list(x) for x in b[column]], column


def test_labels_stored_during_the_run_equal_labelling_the_stored_run(labelled_runs, tmp_path):
    for name, run in labelled_runs.items():
        during = load_spans(run)
        turns = load_turns(run)
        decoded = turns[turns.stop_reason != "skipped"]
        assert len(during) == len(decoded) and set(during.skip_reason) == {""}
        assert list(during.sort_values(KEYS).n_tokens) == list(decoded.sort_values(KEYS).new_tokens)
        assert list(during.sort_values(KEYS).context_len) == list(decoded.sort_values(KEYS).context_len)
        copy = _unlabelled_copy(run, tmp_path / name)
        summary = label_run(copy)
        assert summary.turns_labelled == len(decoded) and summary.turns_skipped == 0
        _same_labels(load_spans(copy), during)
        # labelled twice: nothing is added
        files = sorted((copy / "spans.parquet").iterdir())
        again = label_run(copy)
        assert again.turns_labelled == 0 and again.turns_already_labelled == len(decoded)
        assert sorted((copy / "spans.parquet").iterdir()) == files
        # ... and a run labelled during the run needs no labelling
        assert label_run(run).turns_already_labelled == len(decoded)
        # compaction keeps both: the run's own parts and the added ones merge into one file each
        full = shutil.copytree(run, tmp_path / f"{name}-full")
        for directory in (full, copy):
            RunStore(directory).compact()
            assert [p.name[:8] for p in (directory / "spans.parquet").iterdir()] == ["compact-"]
            _same_labels(load_spans(directory), during)


def test_compare_rebuilds_the_same_contexts(labelled_runs, tiny_qwen3_dir):
    """`evalsuite compare` and `evalsuite label` share one rebuild (replay.stored_contexts)."""
    from evalsuite.compare import turn_contexts
    from evalsuite.spans import ids_hash
    from evalsuite.target.model import load_chat

    chat = load_chat(str(tiny_qwen3_dir))
    for run in labelled_runs.values():
        spans = load_spans(run)
        contexts = turn_contexts(run, chat, set(zip(spans.method, spans.sample_id, spans.turn)))
        for row in spans.itertuples():
            assert ids_hash(contexts[(row.method, row.sample_id, row.turn)]) == row.context_sha256


def test_the_logged_turn_sees_the_tool_call_and_its_result(labelled_runs):
    stored = load_spans(labelled_runs["custom"])
    assert sorted(stored[stored.method == "ar"].turn) == [0, 1, 2]  # two logged replies + the final free turn
    contexts = stored.set_index(KEYS).context_len
    assert contexts[("ar", "conv", 0)] < contexts[("ar", "conv", 1)] < contexts[("ar", "conv", 2)]


def test_acceptance_by_span_adds_up_to_the_run_totals(labelled_runs):
    for run in labelled_runs.values():
        steps, turns, spans = load_steps(run), load_turns(run), load_spans(run)
        table = acceptance_by_span(steps, turns, spans)
        ngram = steps[steps.method == "ngram"]
        for group in (["tool_call", "code", "prose", "other"], ["copied", "novel"], ["all"]):
            cells = table[table.span.isin(group)]
            assert cells.drafted.sum() == ngram.num_drafted.sum()
            assert cells.accepted.sum() == ngram.num_accepted.sum()
            assert cells.n_tokens.sum() == turns[turns.method == "ngram"].new_tokens.sum()
        per_turn = copy_ratio_per_turn(turns, spans)
        assert per_turn.copy_ratio.between(0, 1).all() and len(per_turn) == len(spans)
        copy = copy_ratio_by_task(turns, spans, steps)
        assert "tau ngram" in copy.columns and (copy.contexts == "all").sum() == 1
        assert "copied" in span_paragraph(table, copy, per_turn, 8)


def test_the_report_gets_a_span_section_only_for_labelled_runs(labelled_runs, tmp_path):
    from evalsuite.report.build import write_report

    unlabelled = _unlabelled_copy(labelled_runs["mt-bench"], tmp_path / "unlabelled")
    report = write_report([unlabelled], tmp_path / "plain", formats={"md", "csv"}, n_resamples=100)
    assert "Acceptance by span" not in (tmp_path / "plain" / "report.md").read_text()
    report = write_report([labelled_runs["mt-bench"]], tmp_path / "report", formats={"md", "csv"}, n_resamples=100)
    page = (tmp_path / "report" / "report.md").read_text()
    assert "## Acceptance by span type and by copying" in page and "acceptance_by_span.png" in page
    table = pd.read_csv(tmp_path / "report" / "tables" / "acceptance_by_span.csv")
    assert list(table.columns) == ["task", "method", "span", "n_tokens", "share_of_output", "drafted", "accepted",
                                   "acceptance_per_drafted", "mean_accepted_per_step"]
    assert (tmp_path / "report" / "tables" / "copy_ratio.csv").exists()
    assert any(p.name == "acceptance_by_span.svg" for p in report.files)


# ---- the command ---------------------------------------------------------------------------------------------------
def test_label_command_and_its_bad_input(labelled_runs, tmp_path, tiny_qwen3_dir):
    run = _unlabelled_copy(labelled_runs["custom"], tmp_path / "run")
    result = cli.invoke(app, ["label", str(run)])
    assert result.exit_code == 0, result.output
    assert "turns labelled" in result.output and (run / "spans.parquet").is_dir()
    result = cli.invoke(app, ["label", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "not a run directory" in result.output
    # a tokenizer whose chat template differs from the run's cannot rebuild its contexts
    other = tmp_path / "other-target"
    shutil.copytree(tiny_qwen3_dir, other)
    config_path = other / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if "chat_template" in config:
        config["chat_template"] = config["chat_template"].replace("<|im_start|>", "<|im_start|> ")
        config_path.write_text(json.dumps(config))
    template = other / "chat_template.jinja"
    if template.exists():
        template.write_text(template.read_text().replace("<|im_start|>", "<|im_start|> "))
    shutil.rmtree(run / "spans.parquet")
    result = cli.invoke(app, ["label", str(run), "--target", str(other)])
    assert result.exit_code == 2 and "chat template hashes to" in " ".join(result.output.split())
