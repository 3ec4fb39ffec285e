"""Task adapters on their bundled data (or SYNTHETIC fixtures for the hub-only ones): counts, roles, golden
prompts, seeded subsets; malformed records; hub fallbacks; the tool fallback of `evalsuite.target.chat`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.errors import UserError
from evalsuite.target.chat import fit_to_template
from evalsuite.target.model import TargetModel
from evalsuite.tasks import TASKS, LoadOptions, get_task
from evalsuite.tasks import _source

FIXTURES = Path(__file__).parent / "fixtures"
TASK_NAMES = ["agentlongbench", "agentmemorybench", "alpaca", "bfcl-v3", "custom", "gsm8k", "humaneval",
              "livecodebench", "longbench-v2", "math500", "mbpp", "mt-bench", "swebench"]
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def load(task: str, **options):
    return get_task(task).load(LoadOptions(**options))


def by_id(trajectories, sample_id):
    return next(t for t in trajectories if t.sample_id == sample_id)


@pytest.fixture(scope="module")
def target(tiny_llama_dir) -> TargetModel:
    return TargetModel.load(str(tiny_llama_dir))


def rendered(target: TargetModel, messages, tools=None) -> str:
    """What the runner sends, as text (the tiny tokenizer is byte-level, so decoding is exact)."""
    messages, tools = fit_to_template(messages, tools, target.chat_template)
    return target.tokenizer.decode(target.render(messages, tools))


# ---- the registry and the CLI listing ------------------------------------------------------------------------
def test_all_twelve_tasks_and_custom_are_registered_with_a_licence():
    get_task("gsm8k")
    assert sorted(TASKS) == TASK_NAMES
    assert all(TASKS[name].licence for name in TASK_NAMES)
    assert "non-commercial" in TASKS["alpaca"].licence and "CC BY-NC" in TASKS["alpaca"].licence
    assert {n for n in TASK_NAMES if TASKS[n].default_replay == "logged"} == {
        "agentlongbench", "bfcl-v3", "custom", "swebench"}


def test_tasks_command_lists_every_task_with_its_licence(monkeypatch):
    from rich.console import Console

    import evalsuite.cli

    monkeypatch.setattr(evalsuite.cli, "out", Console(width=1000))
    result = CliRunner().invoke(app, ["tasks"], catch_exceptions=False)
    assert result.exit_code == 0
    for name in TASK_NAMES:
        assert name in result.output
    assert "CC BY-NC 4.0" in result.output


# ---- single-turn tasks: counts, golden prompts ------------------------------------------------------------------
@pytest.mark.parametrize("task,options,count", [
    ("gsm8k", {}, 1319), ("math500", {}, 500), ("humaneval", {}, 164), ("mbpp", {}, 257),
    ("livecodebench", {}, 1055), ("alpaca", {}, 80), ("alpaca", {"subset": "alpaca_eval"}, 805),
    ("longbench-v2", {}, 17), ("swebench", {"subset": "lite"}, 150),
])
def test_single_turn_tasks_have_one_user_turn_per_record(task, options, count):
    trajectories = load(task, **options)
    assert len(trajectories) == count
    assert len({t.sample_id for t in trajectories}) == count
    for t in trajectories:
        assert len(t.turns) == 1 and t.turns[0].logged_reply is None
        assert [m["role"] for m in t.turns[0].new_messages] == ["user"]


GOLDEN_PROMPTS = [
    ("gsm8k", {}, "gsm8k-5",
     "Kylar went to the store to buy glasses for his new apartment. One glass costs $5, but every second glass costs "
     "only 60% of the price. Kylar wants to buy 16 glasses. How much does he need to pay for them?" + BOXED),
    ("math500", {}, "math500-3", "How many positive whole-number divisors does 196 have?" + BOXED),
    ("humaneval", {}, "HumanEval/2",
     "Write a solution to the following problem and make sure that it passes the tests:\n```python\n\n\n"
     "def truncate_number(number: float) -> float:\n    \"\"\" Given a positive floating point number, it can be "
     "decomposed into\n    and integer part (largest integer smaller than given number) and decimals\n    (leftover "
     "part always smaller than 1).\n\n    Return the decimal part of the number.\n    >>> truncate_number(3.5)\n"
     "    0.5\n    \"\"\"\n\n```"),
    ("mbpp", {}, "mbpp-12",
     "Write a function to sort a given matrix in ascending order according to the sum of its rows."),
    ("alpaca", {}, "alpaca-1", "Calculate the atomic mass for lithium."),
    ("alpaca", {"subset": "alpaca_eval"}, "alpaca-3", "What is some cool music from the 1920s?"),
    ("mt-bench", {}, "mt-bench-81", "Compose an engaging travel blog post about a recent trip to Hawaii, "
                                    "highlighting cultural experiences and must-see attractions."),
]


@pytest.mark.parametrize("task,options,sample_id,prompt", GOLDEN_PROMPTS)
def test_known_prompt_renders_exactly(target, task, options, sample_id, prompt):
    trajectory = by_id(load(task, **options), sample_id)
    assert rendered(target, trajectory.turns[0].new_messages) == (
        f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")


def test_livecodebench_bundled_prompts_match_the_reference_template():
    """DeepSpec's pre-formatted prompts must equal what format_prompt builds from the raw LCB fields."""
    from evalsuite.tasks.livecodebench import format_prompt

    for trajectory in load("livecodebench"):
        prompt = trajectory.turns[0].new_messages[0]["content"]
        question = prompt.split("### Question:\n", 1)[1].rsplit("\n\n### Format: ", 1)[0]
        code = prompt.split("```python\n", 1)[1].rsplit("\n```", 1)[0]
        assert prompt == format_prompt(question, None if code == "# YOUR CODE HERE" else code)


def test_livecodebench_raw_rows_are_formatted(tmp_path):
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps({"question_id": "abc", "question_content": "Add two numbers.",
                                "starter_code": "class Solution:\n    def add(self):"}) + "\n")
    prompt = load("livecodebench", data_path=str(path))[0].turns[0].new_messages[0]["content"]
    assert prompt == (
        "You are an expert Python programmer. You will be given a question (problem specification) and will generate "
        "a correct Python program that matches the specification and passes all tests. You will NOT return anything "
        "except for the program\n\n### Question:\nAdd two numbers.\n\n### Format: Use the following code structure:\n"
        "```python\nclass Solution:\n    def add(self):\n```\n\n### Answer: (use the provided format with backticks)")


def test_alpaca_input_field_uses_the_reference_format(tmp_path):
    path = tmp_path / "alpaca.jsonl"
    path.write_text(json.dumps({"instruction": "Sort these.", "input": "b, a"}) + "\n"
                    + json.dumps({"instruction": "Say hi.", "input": ""}) + "\n")
    prompts = [t.turns[0].new_messages[0]["content"] for t in load("alpaca", data_path=str(path))]
    assert prompts == ["Sort these.\n\nInput:\nb, a", "Say hi."]


def test_longbench_v2_prompt_and_subsets():
    from evalsuite.tasks.longbench_v2 import BUNDLED

    index = [json.loads(line) for line in (BUNDLED / "index.jsonl").read_text().splitlines()]
    item = next(r for r in index if r["context_shipped"] and r["domain"] == "Code Repository Understanding")
    context = (BUNDLED / "items" / item["context_file"]).read_text(encoding="utf-8")
    trajectory = by_id(load("longbench-v2"), f"longbench-v2-{item['_id']}")
    assert trajectory.turns[0].new_messages[0]["content"] == f"{context}\n\nQuestion: {item['question']}"
    counts = {s: len(load("longbench-v2", subset=s)) for s in
              ("single_document_qa", "multi_document_qa", "long_dialogue", "in_context_learning", "code_repo",
               "structured_data")}
    assert counts == {"single_document_qa": 3, "multi_document_qa": 3, "long_dialogue": 4,
                      "in_context_learning": 3, "code_repo": 2, "structured_data": 2}
    with pytest.raises(UserError, match="longbench-v2 has subsets"):
        load("longbench-v2", subset="nope")


def test_swebench_lite_prompt_format():
    trajectory = load("swebench", subset="lite")[0]
    text = trajectory.turns[0].new_messages[0]["content"]
    assert text.startswith("Problem Statement:\n") and text.endswith("\nPlease fix the issue described above.")


# ---- seeded subsets ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task,options", [("gsm8k", {}), ("swebench", {}), ("bfcl-v3", {}), ("mt-bench", {}),
                                          ("agentmemorybench", {"data_path": str(
                                              FIXTURES / "agentmemorybench" / "memoryagentbench_SYNTHETIC.jsonl")})])
def test_seeded_subset_is_deterministic_and_depends_on_the_seed(task, options):
    first = [t.sample_id for t in load(task, limit=5, seed=0, **options)]
    again = [t.sample_id for t in load(task, limit=5, seed=0, **options)]
    other = [t.sample_id for t in load(task, limit=5, seed=1, **options)]
    everything = {t.sample_id for t in load(task, **options)}
    assert first == again and len(set(first)) == 5 and set(first) <= everything
    assert first != other


def test_seeded_subset_matches_random_shuffle_of_the_reference_scripts():
    import random

    ids = [t.sample_id for t in load("gsm8k")]
    random.Random(0).shuffle(ids)
    assert [t.sample_id for t in load("gsm8k", limit=4, seed=0)] == ids[:4]


# ---- multi-turn tasks ----------------------------------------------------------------------------------------
def test_mt_bench_has_two_free_running_user_turns():
    trajectories = load("mt-bench")
    assert len(trajectories) == 80
    assert all(len(t.turns) == 2 and all(turn.logged_reply is None for turn in t.turns) for t in trajectories)


def test_swebench_mini_swe_agent_turns_follow_the_assistant_messages():
    from evalsuite.tasks.swebench import BUNDLED

    trajectories = load("swebench")
    assert len(trajectories) == 30
    for t in trajectories:
        path = BUNDLED["mini-swe-agent"] / t.sample_id.removeprefix("swebench-") / (
            t.sample_id.removeprefix("swebench-") + ".traj.json")
        messages = json.loads(path.read_text())["messages"]
        assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        assert len(t.turns) == len(assistants)
        assert [m["role"] for m in t.turns[0].new_messages] == ["system", "user"]
        assert all([m["role"] for m in turn.new_messages] == ["user"] for turn in t.turns[1:])
        assert [turn.logged_reply["content"] for turn in t.turns] == [messages[i]["content"] for i in assistants]
        assert all(set(turn.logged_reply) == {"role", "content"} for turn in t.turns)  # `extra` is dropped
    assert sum(len(t.turns) for t in trajectories) == 777
    assert min(len(t.turns) for t in trajectories) == 16 and max(len(t.turns) for t in trajectories) == 42


def test_swebench_swe_agent_traj_keeps_tool_calls_and_tool_results():
    trajectories = {t.sample_id: t for t in load("swebench", subset="swe-agent")}
    assert {k: len(v.turns) for k, v in trajectories.items()} == {
        "swebench-swe-agent__test-repo-i1": 5, "swebench-pydicom__pydicom-1458": 12,
        "swebench-marshmallow-code__marshmallow-1867": 11}
    demo = trajectories["swebench-marshmallow-code__marshmallow-1867"]
    first_call = demo.turns[0].logged_reply["tool_calls"][0]
    assert first_call["function"] == {"name": "create", "arguments": {"filename": "reproduce.py"}}
    assert [m["role"] for m in demo.turns[1].new_messages] == ["tool"]
    assert demo.turns[1].new_messages[0]["tool_call_id"] == first_call["id"]


def test_bfcl_turns_tools_and_ground_truth_calls():
    trajectories = load("bfcl-v3")
    assert len(trajectories) == 200 and sum(len(t.turns) for t in trajectories) == 745
    t = by_id(trajectories, "multi_turn_base_0")
    assert [m["role"] for turn in t.turns for m in turn.new_messages] == ["user"] * 4
    assert [c["function"]["name"] for c in t.turns[0].logged_reply["tool_calls"]] == ["cd", "mkdir", "mv"]
    assert t.turns[0].logged_reply["tool_calls"][2]["function"]["arguments"] == {
        "source": "final_report.pdf", "destination": "temp"}
    # sort('final_report.pdf'): the positional argument takes the doc's first parameter name
    assert t.turns[2].logged_reply["tool_calls"][0]["function"] == {
        "name": "sort", "arguments": {"file_name": "final_report.pdf"}}
    names = [tool["function"]["name"] for tool in t.tools]
    assert "cd" in names and "post_tweet" in names and len(names) == len(set(names))
    cd = next(tool["function"] for tool in t.tools if tool["function"]["name"] == "cd")
    assert cd["parameters"]["type"] == "object"
    assert cd["description"].endswith(" Note that the provided function is in Python 3 syntax.")


def test_bfcl_float_parameters_follow_bfcl_conversion():
    from evalsuite.tasks.bfcl_v3 import bfcl_tool

    tool = bfcl_tool({"name": "a.b", "description": "D.", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float", "description": "X."}, "t": {"type": "tuple", "items": {"type": "float"}},
        "d": {"type": "dict", "properties": {"y": {"type": "any", "description": "Y."}}}}}})
    function = tool["function"]
    assert function["name"] == "a_b"
    props = function["parameters"]["properties"]
    assert props["x"] == {"type": "number", "format": "float", "description": "X. This is a float type value."}
    assert props["t"] == {"type": "array", "items": {"type": "number"}}
    assert props["d"]["properties"]["y"]["type"] == "string"


def test_bfcl_tools_render_as_text_on_a_template_without_tool_support(target):
    t = by_id(load("bfcl-v3"), "multi_turn_base_0")
    text = rendered(target, t.turns[0].new_messages + [t.turns[0].logged_reply], t.tools)
    assert text.startswith("<|im_start|>system\nYou can call the following functions.")
    assert json.dumps(t.tools[0], ensure_ascii=False) in text
    assert ('<|im_start|>assistant\n<tool_call>{"name": "cd", "arguments": {"folder": "document"}}</tool_call>\n'
            '<tool_call>{"name": "mkdir", "arguments": {"dir_name": "temp"}}</tool_call>\n') in text


def test_agentlongbench_fixture_per_round_and_final_only():
    root = str(FIXTURES / "agentlongbench")
    trajectories = load("agentlongbench", data_path=root)  # default filter: 64k
    assert sorted((t.sample_id, len(t.turns)) for t in trajectories) == [
        ("agentlongbench-kf-v-64k-SYNTHETIC-int-0", 4), ("agentlongbench-ki-c-64k-SYNTHETIC-cft-0", 6),
        ("agentlongbench-ki-c-64k-SYNTHETIC-cft-1", 4)]
    t = by_id(trajectories, "agentlongbench-ki-c-64k-SYNTHETIC-cft-0")
    first = t.turns[0].new_messages
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[0]["content"].startswith("You are analyzing a guess-the-Pokemon dialogue.")
    assert "SYNTHETIC original system prompt" not in json.dumps([turn.new_messages for turn in t.turns])
    assert [m["role"] for m in t.turns[2].new_messages] == ["tool"]
    assert t.turns[-1].logged_reply is None
    assert t.turns[-1].new_messages == [{"role": "user", "content": "SYNTHETIC: how many times did the tool "
                                                                    "return Pikachu_13?"}]
    final = by_id(load("agentlongbench", data_path=root, subset="final:64k"), t.sample_id)
    assert len(final.turns) == 1
    flat = [m for turn in t.turns for m in turn.new_messages + ([turn.logged_reply] if turn.logged_reply else [])]
    assert final.turns[0].new_messages == flat
    masked = by_id(trajectories, "agentlongbench-kf-v-64k-SYNTHETIC-int-0")
    assert masked.turns[0].new_messages[0]["content"].startswith("You are reviewing a masked guess-the-entity")
    assert [t.sample_id for t in load("agentlongbench", data_path=root, subset="ki-c/128k")] == [
        "agentlongbench-ki-c-128k-SYNTHETIC-cft-128k"]


def test_agentmemorybench_fixture_follows_dlite_sampling_and_prompts(tmp_path):
    fixture = FIXTURES / "agentmemorybench" / "memoryagentbench_SYNTHETIC.jsonl"
    trajectories = load("agentmemorybench", data_path=str(fixture))
    counts = {}
    for t in trajectories:
        counts[t.meta["category"]] = counts.get(t.meta["category"], 0) + 1
        assert len(t.turns) == 1 and [m["role"] for m in t.turns[0].new_messages] == ["system", "user"]
    assert counts == {"factconsolidation_64k": 50, "eventqa_64k": 10, "detectiveqa_free": 1}
    fact = [t.sample_id for t in trajectories if t.meta["category"] == "factconsolidation_64k"]
    assert fact[:3] == ["agentmemorybench-factconsolidation_64k-c0-q0", "agentmemorybench-factconsolidation_64k-c0-q1",
                        "agentmemorybench-factconsolidation_64k-c0-q2"] and fact[-1].endswith("-q59")
    detective = by_id(trajectories, "agentmemorybench-detectiveqa_free-c0-q0").turns[0].new_messages
    assert detective[0]["content"] == ("You are a helpful assistant that can read a long context and answer "
                                       "questions based on it.")
    assert detective[1]["content"] == (
        "Read the following detective story and answer the question using a free-form response. No answer choices "
        "are provided. Explain your answer based on evidence from the story.\n\n[Story]\nSYNTHETIC detective story. "
        "The butler was in the garden.\n\nQuestion: Who was in the garden?\nAnswer:")
    # the same rows as Parquet, in a directory named as DLite names its per-category files
    rows = [json.loads(line) for line in fixture.read_text().splitlines()]
    dlite = tmp_path / "dlite"
    dlite.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[1:2]), dlite / "EventQA_64K_Qwen3-00000-of-00001.parquet")
    events = load("agentmemorybench", data_path=str(dlite), subset="eventqa_64k")
    assert len(events) == 10
    assert events[0].turns[0].new_messages[1]["content"].startswith(
        "Read the following book context, then predict the event requested by the question.\n\n[Book Context]\n")


# ---- custom ------------------------------------------------------------------------------------------------
def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_custom_messages_and_prompt_ids(tmp_path, target):
    path = write_jsonl(tmp_path / "mine.jsonl", [
        {"id": "chat", "messages": [
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "List files."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
            {"role": "assistant", "content": "There is a.txt."}, {"role": "user", "content": "Thanks."}],
         "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]},
        {"id": 7, "prompt_ids": [5, 6, 7]},
    ])
    chat, raw = load("custom", data_path=str(path))
    assert [len(t.turns) for t in (chat, raw)] == [3, 1]
    assert [[m["role"] for m in turn.new_messages] for turn in chat.turns] == [["system", "user"], ["tool"], ["user"]]
    assert chat.turns[2].logged_reply is None and raw.turns[0].prompt_ids == [5, 6, 7] and raw.sample_id == "7"
    text = rendered(target, chat.turns[0].new_messages + [chat.turns[0].logged_reply] + chat.turns[1].new_messages,
                    chat.tools)
    assert text.endswith('<|im_start|>assistant\n<tool_call>{"name": "ls", "arguments": {"path": "."}}</tool_call>'
                         '<|im_end|>\n<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n'
                         '<|im_start|>assistant\n')


MALFORMED = [
    ({"messages": [{"role": "user", "content": "hi"}]}, "needs an 'id'"),
    ({"id": "a"}, "exactly one of 'messages' or 'prompt_ids'"),
    ({"id": "a", "messages": [{"role": "user"}]}, "message 0: message has no 'content'"),
    ({"id": "a", "messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]},
     "wrong role order: assistant message before any user message"),
    ({"id": "a", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]},
     "wrong role order: tool result without a preceding tool call"),
    ({"id": "a", "messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]},
     "wrong role order: system message after the conversation started"),
    ({"id": "a", "messages": [{"role": "user", "content": "   "}]}, "user message has empty content"),
    ({"id": "a", "messages": [{"role": "robot", "content": "x"}]}, "role 'robot' is not one of"),
    ({"id": "a", "messages": []}, "'messages' must be a non-empty list"),
    ({"id": "a", "prompt_ids": [1, -2]}, "non-negative integers"),
    ({"id": "a", "prompt_ids": []}, "non-empty list"),
]


@pytest.mark.parametrize("record,message", MALFORMED)
def test_custom_malformed_record_is_one_line_naming_file_and_record(tmp_path, record, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"id": "ok", "prompt_ids": [1]}, record])
    with pytest.raises(UserError) as err:
        load("custom", data_path=str(path))
    text = str(err.value)
    assert "\n" not in text and f"{path}:2" in text and message in text


@pytest.mark.parametrize("raw,message", [
    (b'{"id": "a", "messages": [{"role": "user", "content": "caf\xe9"}]}\n', ":1: not valid UTF-8"),
    (b'{"id": "a", "messages": \n', ":1: not valid JSON"),
    (b'["not an object"]', "[0]: expected a JSON object"),
])
def test_custom_unreadable_file_is_one_line(tmp_path, raw, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(raw)
    with pytest.raises(UserError) as err:
        load("custom", data_path=str(path))
    assert "\n" not in str(err.value) and message in str(err.value) and str(path) in str(err.value)


def test_custom_duplicate_ids_and_missing_file(tmp_path):
    path = write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "prompt_ids": [1]}, {"id": "a", "prompt_ids": [2]}])
    with pytest.raises(UserError, match="repeats an earlier record"):
        load("custom", data_path=str(path))
    with pytest.raises(UserError, match="no such file"):
        load("custom", data_path=str(tmp_path / "missing.jsonl"))


def test_malformed_records_of_other_tasks(tmp_path):
    gsm = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "1+1?"}, {"answer": "2"}])
    with pytest.raises(UserError, match=f"{gsm}:2: record has no non-empty 'question'"):
        load("gsm8k", data_path=str(gsm))
    traj = tmp_path / "x.traj.json"
    traj.write_text(json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                             {"role": "assistant", "content": ""}]}))
    with pytest.raises(UserError, match="message 2: assistant message has empty content"):
        load("swebench", data_path=str(traj))
    memory = write_jsonl(tmp_path / "m.jsonl", [{"context": "c", "questions": "not a list",
                                                  "metadata": {"source": "eventqa_65536"}}])
    with pytest.raises(UserError, match="'questions' must be a non-empty list"):
        load("agentmemorybench", data_path=str(memory), subset="eventqa_64k")
    bench = tmp_path / "benchmark" / "ki-c" / "64k" / "tool_response"
    bench.mkdir(parents=True)
    write_jsonl(bench / "count_frequency_tool.jsonl", [{"id": 1, "question_type": "Nope", "messages": [],
                                                        "question": "q"}])
    with pytest.raises(UserError, match="is not an AgentLongBench question type"):
        load("agentlongbench", data_path=str(tmp_path / "benchmark"))


# ---- the hub path ------------------------------------------------------------------------------------------
def test_hub_unreachable_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(_source, "hub_reachable", lambda timeout=3.0: False)
    for task in ("gsm8k", "math500", "humaneval", "mbpp", "livecodebench", "alpaca", "mt-bench", "longbench-v2",
                 "swebench", "agentmemorybench"):
        with pytest.raises(UserError) as err:
            load(task, data_path="hub")
        assert "\n" not in str(err.value) and "not reachable" in str(err.value) and "--data-path" in str(err.value)
    with pytest.raises(UserError, match="openai/gsm8k"):
        load("gsm8k", data_path="hub")
    with pytest.raises(UserError, match="livecodebench/code_generation_lite"):
        load("livecodebench", data_path="hub")


def test_hub_only_tasks_without_data_say_how_to_get_it():
    for task, hub_id in (("agentlongbench", "ign1s/AgentLongBench"), ("agentmemorybench", "ai-hyz/MemoryAgentBench")):
        with pytest.raises(UserError) as err:
            load(task)
        assert "\n" not in str(err.value) and hub_id in str(err.value) and "--data-path" in str(err.value)


def test_hub_rows_pass_the_reference_ids_to_datasets(monkeypatch):
    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return [{"question": "What is 2+2?", "prompt": "Write f."}]

    import datasets

    monkeypatch.setattr(_source, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    trajectories = load("gsm8k", data_path="hub")
    assert calls == [("openai/gsm8k", "main", "test")]
    assert trajectories[0].turns[0].new_messages[0]["content"] == "What is 2+2?" + BOXED
    load("mbpp", data_path="hub")
    assert calls[-1] == ("google-research-datasets/mbpp", "sanitized", "test")


# ---- evalsuite.target.chat on a template with native tool support ------------------------------------------------------
def test_templates_with_tool_support_get_the_messages_unchanged():
    template = "{% for m in messages %}{{ m.role }}{% if m.tool_calls %}{% endif %}{% if m.role == 'tool' %}" \
               "{% endif %}{% endfor %}{% if tools %}{% endif %}"
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
                {"role": "tool", "content": "r"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert fit_to_template(messages, tools, template) == (messages, tools)


def test_replay_source_names_who_wrote_the_logged_replies():
    from evalsuite.tasks.base import replay_source

    swe = load("swebench")[:3]
    assert {t.meta["model"] for t in swe} == {"google/gemini-3-pro-preview"}
    assert replay_source(swe, "logged") == "logged replies of google/gemini-3-pro-preview (mini-swe-agent)"
    assert replay_source(swe, "free") == "each method's own earlier replies"
    bfcl = load("bfcl-v3")[:3]
    assert replay_source(bfcl, "logged").startswith("logged replies of BFCL's ground-truth calls")
    assert replay_source(load("gsm8k")[:3], "free") == "single-turn samples: no earlier replies in any context"


def test_the_long_swebench_subset_is_held_out_of_training_and_of_the_main_sample():
    """--subset mini-swe-agent-long: 12 runs over 8 repositories, none of them a training trajectory or one of the
    30 of the default subset (tasks/swebench/trajectories/README.md, A2)."""
    import gzip
    import json

    from evalsuite.tasks.base import DATA_DIR

    long = get_task("swebench").load(LoadOptions(subset="mini-swe-agent-long"))
    main = get_task("swebench").load(LoadOptions())
    ids = {t.meta["instance_id"] for t in long}
    assert len(long) == 12 and len({t.meta["repo"] for t in long}) == 8
    assert not ids & {t.meta["instance_id"] for t in main}
    training = DATA_DIR / "training" / "mini-swe-agent_gemini-3-pro_train.jsonl.gz"
    with gzip.open(training, "rt") as handle:
        assert not ids & {json.loads(line)["id"] for line in handle}
    assert all(t.meta["resolved"] in (True, False) for t in long)
