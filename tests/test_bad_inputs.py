"""Bad input through the real CLI entry: every case ends with exit code 2 and one line on stderr that names the
thing to fix, never a traceback, never a silent fallback.

Three groups, each a parametrized table: the command line (options, --drafter, --subset, --out, --resume with
each drift field), the data (`--task custom --data-path`), and the models (target and drafter checkpoints).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.config import DRIFT_FIELDS
from evalsuite.testing import drop_chat_template
from tests.helpers import dlite_checkpoint, zlab_checkpoint

cli = CliRunner()
# The tiny test targets (tests/conftest.py): 4 layers, hidden size 64, a 260-token byte vocabulary.
TINY = SimpleNamespace(hidden_size=64, vocab_size=260, num_layers=4)


def run_cli(*args: str):
    return cli.invoke(app, ["run", *args], catch_exceptions=False)  # an exception would fail the test


def assert_one_line_error(result, *needles: str) -> str:
    text = result.output.strip()
    assert result.exit_code == 2, text
    assert "Traceback" not in text, text
    assert len(text.splitlines()) == 1, text
    assert text.startswith("error:"), text
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"
    return text


@pytest.fixture(scope="module")
def base(tiny_llama_dir) -> list[str]:
    """A run that would succeed: every case changes one thing."""
    return ["--target", str(tiny_llama_dir), "--task", "mt-bench", "--method", "ngram", "--limit", "1",
            "--max-new-tokens", "4", "--no-warmup"]


# ---- the command line ------------------------------------------------------------------------------------------
CLI_CASES = {
    "unknown method": (["--method", "nosuch"], ["unknown method 'nosuch'", "choose from"]),
    "unknown method in a list": (["--method", "ngram,eagel3"], ["unknown method 'eagel3'"]),
    "empty method list": (["--method", ","], ["--method"]),
    "unknown task": (["--task", "nosuch"], ["unknown task 'nosuch'", "gsm8k"]),
    "k zero": (["--k", "0"], ["--k 0", "between 1 and 64"]),
    "k too large": (["--k", "100"], ["--k 100"]),
    "negative temperature": (["--temperature", "-0.5"], ["--temperature -0.5"]),
    "nan temperature": (["--temperature", "nan"], ["--temperature nan"]),
    "top-p zero": (["--top-p", "0"], ["--top-p 0"]),
    "top-p above one": (["--top-p", "1.5"], ["--top-p 1.5", "(0, 1]"]),
    "negative top-k": (["--top-k", "-1"], ["--top-k -1"]),
    "max-new-tokens zero": (["--max-new-tokens", "0"], ["--max-new-tokens 0"]),
    "limit zero": (["--limit", "0"], ["--limit 0"]),
    "max-turns zero": (["--max-turns", "0"], ["--max-turns 0", ">= 1"]),
    "negative max-turns": (["--max-turns", "-3"], ["--max-turns -3"]),
    "unknown replay": (["--replay", "sideways"], ["--replay sideways", "auto, logged, free"]),
    "unknown context policy": (["--context-policy", "wrap"], ["--context-policy wrap"]),
    "unknown weight layout": (["--weight-layout", "diagonal"], ["--weight-layout diagonal"]),
    "unknown dtype": (["--dtype", "float8"], ["--dtype float8"]),
    "unknown device": (["--device", "gpu"], ["--device gpu", "cpu or cuda[:N]"]),
    "device of another kind": (["--device", "meta"], ["--device meta", "cpu or cuda[:N]"]),
    "bfloat16 on cpu": (["--dtype", "bfloat16"], ["--dtype bfloat16", "CPU"]),
    "drafter key typo": (["--method", "dlite", "--drafter", "dlitee=some/dir"], ["--drafter dlitee=some/dir",
                                                                                 "unknown method 'dlitee'"]),
    "drafter for a method not run": (["--method", "ngram,dflash", "--drafter", "dlite=some/dir"],
                                     ["--drafter dlite=some/dir", "not in --method"]),
    "drafter for a method without checkpoints": (["--method", "ngram", "--drafter", "ngram=some/dir"],
                                                 ["ngram takes no checkpoint"]),
    "drafter path with no learned method": (["--method", "ngram", "--drafter", "some/dir"],
                                            ["--drafter some/dir", "takes a checkpoint"]),
    "two drafters for one method": (["--method", "dlite", "--drafter", "dlite=a/b", "--drafter", "dlite=c/d"],
                                    ["two checkpoints for dlite"]),
    "drafter with nothing after =": (["--method", "dlite", "--drafter", "dlite="], ["--drafter dlite="]),
    "bare drafter with several learned methods": (["--method", "dlite,dflash", "--drafter", "x/y"],
                                                  ["METHOD=PATH"]),
    "method option for a method not run": (["--method-option", "dspark.confidence_threshold=0.5"],
                                           ["--method-option", "dspark is not in --method"]),
    "method auto without a drafter": (["--method", "auto"], ["--method auto", "--drafter"]),
    "method option out of range": (["--method", "dspark", "--drafter", "random", "--method-option",
                                    "dspark.confidence_threshold=2"], ["dspark.confidence_threshold=2",
                                                                       "must be in [0, 1]"]),
    "unknown method option": (["--method", "ngram", "--method-option", "ngram.max_ngarm=4"],
                              ["ngram.max_ngarm", "did you mean max_ngram?"]),
    "method typo": (["--method", "dlte"], ["unknown method 'dlte'", "did you mean dlite?"]),
    "task typo": (["--task", "swebnch"], ["unknown task 'swebnch'", "did you mean swebench?"]),
    "unknown engine": (["--engine", "sglang"], ["--engine sglang", "hf, vllm"]),
    "subset of a task without subsets": (["--task", "gsm8k", "--subset", "main"],
                                         ["--subset main", "task gsm8k has no subsets"]),
    "subset of mt-bench": (["--subset", "writing"], ["--subset writing", "mt-bench has no subsets"]),
    "unknown subset": (["--task", "alpaca", "--subset", "nosuch"], ["--subset nosuch", "eagle, alpaca_eval"]),
    "unknown longbench domain": (["--task", "longbench-v2", "--subset", "poetry"], ["--subset poetry",
                                                                                  "single_document_qa"]),
    "unknown bfcl subset": (["--task", "bfcl-v3", "--subset", "parallel"], ["--subset parallel",
                                                                          "base, long_context"]),
    "target that does not exist": (["--target", "/no/such/model"], ["--target /no/such/model",
                                                                    "no such directory"]),
    "target under a missing home dir": (["--target", "~/no-such-evalsuite-model"],
                                        ["--target ~/no-such-evalsuite-model", "no such directory"]),
    "unwritable out": (["--out", "/proc/evalsuite-cannot-write"], ["--out /proc/evalsuite-cannot-write",
                                                                   "not writable"]),
    "data path that does not exist": (["--task", "gsm8k", "--data-path", "/no/such/file.jsonl"],
                                      ["--data-path /no/such/file.jsonl", "no such file"]),
    "custom without data path": (["--task", "custom"], ["--task custom needs --data-path"]),
}


@pytest.mark.parametrize("args, needles", CLI_CASES.values(), ids=CLI_CASES.keys())
def test_bad_command_line(base, args, needles):
    assert_one_line_error(run_cli(*base, *args), *needles)


@pytest.mark.parametrize("args, needles", [
    (["run", "--k", "abc"], ["Invalid value for '--k'", "run --help"]),
    (["run", "--tmperature", "0.5"], ["No such option: --tmperature"]),
    (["nosuch"], ["No such command 'nosuch'"]),
])
def test_usage_errors_through_the_entry_point(args, needles):
    """Errors that Click finds while parsing (before a command runs) are one line too, via `main()`."""
    proc = subprocess.run([sys.executable, "-c", "from evalsuite.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not proc.stdout.strip(), proc.stdout + proc.stderr
    assert_one_line_error(SimpleNamespace(exit_code=proc.returncode, output=proc.stderr), *needles)


def test_no_cuda_device(base):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here, so --device cuda is valid")
    assert_one_line_error(run_cli(*base, "--device", "cuda"), "--device cuda", "no CUDA device")


def test_out_is_a_file(base, tmp_path):
    existing = tmp_path / "a-file"
    existing.write_text("x")
    assert_one_line_error(run_cli(*base, "--out", str(existing)), f"--out {existing}", "not writable")


def test_swebench_subset_with_data_path(base, tmp_path):
    assert_one_line_error(run_cli(*base, "--task", "swebench", "--subset", "lite", "--data-path", str(tmp_path)),
                          "--subset lite", "--data-path")


# ---- --resume with changed settings ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(base, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("resume") / "run"
    result = run_cli(*base, "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


def _copy_run(finished_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def test_rerun_without_resume(base, finished_run, tmp_path):
    out = _copy_run(finished_run, tmp_path)
    assert_one_line_error(run_cli(*base, "--out", str(out)), "already holds results", "--resume")


@pytest.mark.parametrize("field", DRIFT_FIELDS)
def test_resume_refuses_every_drift_field(base, finished_run, tmp_path, field):
    """The stored run differs from this one in `field` only (whatever DRIFT_FIELDS holds, now or later)."""
    out = _copy_run(finished_run, tmp_path)
    stored = json.loads((out / "run.json").read_text())
    stored[field] = {"changed": stored.get(field)}  # unequal to any value the current run can have
    (out / "run.json").write_text(json.dumps(stored))
    assert_one_line_error(run_cli(*base, "--out", str(out), "--resume"), field, "--resume")


@pytest.mark.parametrize("args, field", [
    (["--k", "3"], "k"),
    (["--temperature", "0.7"], "temperature"),
    (["--top-p", "0.9"], "top_p"),
    (["--top-k", "5"], "top_k"),
    (["--seed", "1"], "seed"),
    (["--max-new-tokens", "5"], "max_new_tokens"),
    (["--context-policy", "truncate-left"], "context_policy"),
    (["--enable-thinking"], "enable_thinking"),
    (["--weight-layout", "row-major"], "weight_layout"),
])
def test_resume_refuses_a_changed_option(base, finished_run, tmp_path, args, field):
    out = _copy_run(finished_run, tmp_path)
    assert_one_line_error(run_cli(*base, *args, "--out", str(out), "--resume"), field, "differs")


def test_resume_refuses_another_target(base, finished_run, tmp_path, tiny_qwen3_dir):
    out = _copy_run(finished_run, tmp_path)
    args = [a if a != base[1] else str(tiny_qwen3_dir) for a in base]
    assert_one_line_error(run_cli(*args, "--out", str(out), "--resume"), "target_sha256", "differs")


# ---- data (--task custom --data-path) ----------------------------------------------------------------------
GOOD = {"id": "ok", "messages": [{"role": "user", "content": "hello"}]}
DATA_CASES = {
    "malformed JSON": (b'{"id": "a", "messages": [\n', [":1: not valid JSON"]),
    "empty file": (b"", ["no records"]),
    "blank lines only": (b"\n\n  \n", ["no records"]),
    "non-UTF-8": ('{"id": "a", "messages": [{"role": "user", "content": "caf\u00e9"}]}\n'.encode("latin-1"),
                  [":1: not valid UTF-8"]),
    "not an object": (b'["a", "b"]', ["[0]: expected a JSON object"]),
    "missing id": ([{"messages": GOOD["messages"]}], [":1: record needs an 'id'"]),
    "empty id": ([{"id": " ", "messages": GOOD["messages"]}], [":1: record needs an 'id'"]),
    "duplicate ids": ([GOOD, GOOD], [":2: id 'ok' repeats an earlier record"]),
    "neither messages nor prompt_ids": ([{"id": "a"}], ["exactly one of 'messages' or 'prompt_ids'"]),
    "both messages and prompt_ids": ([GOOD | {"prompt_ids": [5]}], ["exactly one of"]),
    "unknown role": ([{"id": "a", "messages": [{"role": "bot", "content": "x"}]}], ["message 0: role 'bot'"]),
    "assistant first": ([{"id": "a", "messages": [{"role": "assistant", "content": "x"},
                                                  {"role": "user", "content": "y"}]}],
                        ["message 0: wrong role order: assistant message before any user message"]),
    "system after the start": ([{"id": "a", "messages": [{"role": "user", "content": "x"},
                                                         {"role": "system", "content": "y"}]}],
                               ["wrong role order: system message"]),
    "tool result without a call": ([{"id": "a", "messages": [{"role": "user", "content": "x"},
                                                             {"role": "tool", "content": "42"}]}],
                                   ["tool result without a preceding tool call"]),
    "no turns": ([{"id": "a", "messages": []}], ["'messages' must be a non-empty list"]),
    "empty user turn": ([{"id": "a", "messages": [{"role": "user", "content": "  "}]}],
                        ["message 0: user message has empty content"]),
    "only a system message": ([{"id": "a", "messages": [{"role": "system", "content": "be brief"}]}],
                              ["no user or tool message"]),
    "tool call with invalid JSON arguments": ([{"id": "a", "messages": [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "ls", "arguments": "{path: ."}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]}],
        ["message 1 tool call 0 (ls): arguments are not valid JSON"]),
    "tool call with non-object arguments": ([{"id": "a", "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[1, 2]"}}]}]}],
        ["(f): arguments must be a JSON object"]),
    "tools not a list": ([GOOD | {"tools": {"name": "f"}}], ["'tools' must be a list"]),
    "prompt ids out of the vocabulary": ([{"id": "a", "prompt_ids": [5, 6, 260]}],
                                         ["sample a: prompt_ids hold ids outside the target's vocabulary (0..259)"]),
    "negative prompt ids": ([{"id": "a", "prompt_ids": [5, -1]}], ["'prompt_ids' must be a non-empty list"]),
    "prompt ids not integers": ([{"id": "a", "prompt_ids": ["5"]}], ["'prompt_ids' must be"]),
    "empty prompt ids": ([{"id": "a", "prompt_ids": []}], ["'prompt_ids' must be a non-empty list"]),
}


@pytest.mark.parametrize("content, needles", DATA_CASES.values(), ids=DATA_CASES.keys())
def test_bad_custom_data(base, tmp_path, content, needles):
    path = tmp_path / "data.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in content))
    assert_one_line_error(run_cli(*base, "--task", "custom", "--data-path", str(path)), *needles)


def test_data_path_is_a_directory(base, tmp_path):
    assert_one_line_error(run_cli(*base, "--task", "gsm8k", "--data-path", str(tmp_path)), "expects a file")


# ---- models ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_llama_dir) -> dict[str, Path]:
    """Broken targets and misfit drafters, each a directory next to the tiny Llama target."""
    root = tmp_path_factory.mktemp("bad-models")
    found = {}

    def target_copy(name: str) -> Path:
        found[name] = Path(shutil.copytree(tiny_llama_dir, root / name))
        return found[name]

    (target_copy("target without weights") / "model.safetensors").unlink()
    (target_copy("target with corrupt weights") / "model.safetensors").write_bytes(b"\x00" * 64)
    truncated = target_copy("target with truncated weights") / "model.safetensors"
    truncated.write_bytes(truncated.read_bytes()[:4096])
    pickled = target_copy("pickle-only target")
    from safetensors.torch import load_file
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    no_template = target_copy("target without chat template")
    drop_chat_template(no_template)

    good = zlab_checkpoint(root / "dflash", TINY)
    found["dflash"] = good
    found["drafter with another hidden size"] = dlite_checkpoint(root / "hidden", SimpleNamespace(
        hidden_size=96, vocab_size=260, num_layers=4))
    found["drafter with another vocabulary"] = dlite_checkpoint(root / "vocab", SimpleNamespace(
        hidden_size=64, vocab_size=300, num_layers=4))
    found["drafter reading missing layers"] = zlab_checkpoint(root / "layers", TINY, layer_ids=(0, 1, 7))
    found["drafter for a deeper target"] = dlite_checkpoint(root / "depth", SimpleNamespace(
        hidden_size=64, vocab_size=260, num_layers=12), layer_ids=(0, 1, 10, 11))
    no_weights = Path(shutil.copytree(good, root / "no-weights"))
    (no_weights / "model.safetensors").unlink()
    found["drafter without weights"] = no_weights
    corrupt = Path(shutil.copytree(good, root / "corrupt"))
    (corrupt / "model.safetensors").write_bytes(b"{not safetensors}" * 8)
    found["drafter with corrupt weights"] = corrupt
    pickle_only = Path(shutil.copytree(good, root / "pickle"))
    torch.save(load_file(pickle_only / "model.safetensors"), pickle_only / "pytorch_model.bin")
    (pickle_only / "model.safetensors").unlink()
    found["pickle-only drafter"] = pickle_only
    no_config = Path(shutil.copytree(good, root / "no-config"))
    (no_config / "config.json").unlink()
    found["drafter without config"] = no_config
    bad_config = Path(shutil.copytree(good, root / "bad-config"))
    (bad_config / "config.json").write_text("{oops")
    found["drafter with unreadable config"] = bad_config
    unknown = Path(shutil.copytree(good, root / "unknown"))
    (unknown / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    found["checkpoint of no known method"] = unknown
    return found


TARGET_CASES = {
    "target without weights": ["no *.safetensors weights"],
    "target with corrupt weights": ["unreadable", "re-download"],
    "target with truncated weights": ["unreadable"],
    "pickle-only target": ["pytorch_model.bin", "pickled weights are never loaded"],
    "target without chat template": ["has no chat template", "prompt_ids"],
}


@pytest.mark.parametrize("case, needles", TARGET_CASES.items(), ids=TARGET_CASES.keys())
def test_bad_target(base, models, case, needles):
    args = list(base)
    args[args.index("--target") + 1] = str(models[case])
    assert_one_line_error(run_cli(*args), *needles)


DRAFTER_CASES = {
    "drafter with another hidden size": ("dlite", ["hidden size 96 != target hidden size 64"]),
    "drafter with another vocabulary": ("dlite", ["vocabulary 300 != target vocabulary 260"]),
    "drafter reading missing layers": ("dflash", ["reads target layers [7]"]),
    "drafter for a deeper target": ("dlite", ["12-layer target", "4 layers"]),
    "drafter without weights": ("dflash", ["no *.safetensors weights"]),
    "drafter with corrupt weights": ("dflash", ["not a readable safetensors file"]),
    "pickle-only drafter": ("dflash", ["pytorch_model.bin", "pickled weights are never loaded"]),
    "drafter without config": ("dflash", ["no config.json"]),
    "drafter with unreadable config": ("dflash", ["config", "unreadable"]),
    "checkpoint of another method": ("dlite", ["is a dflash checkpoint, not dlite", "--method dflash"]),
    "checkpoint of no known method": ("dflash", ["cannot tell the method"]),
}


@pytest.mark.parametrize("case, spec", DRAFTER_CASES.items(), ids=DRAFTER_CASES.keys())
def test_bad_drafter(base, models, case, spec):
    method, needles = spec
    directory = models["dflash" if case == "checkpoint of another method" else case]
    result = run_cli(*base, "--method", method, "--drafter", f"{method}={directory}")
    assert_one_line_error(result, *needles)
