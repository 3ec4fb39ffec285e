"""AgentLongBench (Fang et al. 2026): guess-the-entity environment rollouts with tool calls, 32k-4M tokens.

Data (hub only, not bundled): `ign1s/AgentLongBench` on the Hugging Face hub, laid out as
`benchmark/<ki|kf>-<c|v>/<length>/<tool_response|env_response|final_guess>/<question_type_slug>.jsonl`; each
line holds `id`, `sample_id`, `question_type`, `messages` (the rollout, OpenAI-style), `question`, `answer`.
Knowledge and history labels come from the path, as in AgentLongBench's `eval/common/mapping.py`.

The conversation is AgentLongBench's `build_prompt`: its system prompt for (question type, knowledge,
history), the rollout's non-system messages, then the question as the last user message. The strings below
are byte-for-byte those of `eval/common/question_logic.py` (euReKa025/AgentLongBench @ aa5de89).

`--subset [final:]<filter>`: the filter picks files by path components, e.g. `64k` (the default, DLite's
length directory), `ki-c/128k`, `kf-v/64k/tool_response`, `ki-c/64k/intersection`.
- Without `final:`: per-round replay. Turn k is the k-th assistant message of the rollout (logged replay by
  default), and the question is the last turn, answered without a logged reply.
- With `final:`: one turn only, the question over the whole rollout, as DLite's
  `prepare_agentlongbench_acceptance.py` measures it (DLite also keeps only 48k-96k-token prompts under the
  Qwen3 tokenizer and picks 50 round-robin over files; neither is applied here).
"""

from __future__ import annotations

import re
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.tasks._conversation import conversation_trajectory
from evalsuite.tasks._source import HUB as HUB_WORD, hub_reachable, local_path, offline_message, read_records, \
    wants_hub
from evalsuite.tasks.base import LoadOptions, Trajectory, Turn, register_task, seeded_subset
from evalsuite.tasks.description import describe

HUB_ID = "ign1s/AgentLongBench"
DEFAULT_FILTER = "64k"
KNOWLEDGE = {"ki": "knowledge_intensive", "kf": "knowledge_free"}
HISTORY = {"c": "Concise-Response", "v": "Verbose-Response"}
CATEGORIES = ("tool_response", "env_response", "final_guess")

COUNT_FREQUENCY_TOOL = "Count Frequency(Tool)"
FIND_DUPLICATES_TOOL = "Find Duplicates(Tool)"
FIND_TARGET_OFFSETS_TOOL = "Find Target Offsets(Tool)"
COUNT_CORRECTNESS_ENV = "Count Correctness(Env)"
COUNT_FREQUENCY_ENV = "Count Frequency(Env)"
FIND_ROUND_LARGEST_VALUE_ENV = "Find Round with Largest Value(Env)"
WEIGHTED_SUMMATION_ENV = "Weighted Summation(Env)"
INTERSECTION = "Intersection"
QUESTION_TYPES = (COUNT_FREQUENCY_TOOL, FIND_DUPLICATES_TOOL, FIND_TARGET_OFFSETS_TOOL, COUNT_CORRECTNESS_ENV,
                  COUNT_FREQUENCY_ENV, FIND_ROUND_LARGEST_VALUE_ENV, WEIGHTED_SUMMATION_ENV, INTERSECTION)

# System prompts keyed by (entity vocabulary, question type[, history]); "pokemon" is knowledge_intensive.
_POKEMON = {
    COUNT_FREQUENCY_TOOL: (
        "You are analyzing a guess-the-Pokemon dialogue. Full conversation history (including tool results and "
        "feedback) is provided. Answer the question based on the tool return values or environment feedback. "
        "Wrap your answer in <answer></answer>.If the answer is a number, answer in arabic numerals (e.g., 3 not "
        "three)."),
    COUNT_FREQUENCY_ENV: (
        "You are analyzing a guess-the-Pokemon dialogue. Full conversation history with feedback is provided.\n"
        "Answer the question by counting occurrences of a property value across all rounds' feedback.\n"
        "Wrap your final answer (a number) in <answer></answer>."),
    FIND_ROUND_LARGEST_VALUE_ENV: (
        "You are analyzing a guess-the-Pokemon dialogue. Full conversation history with feedback is provided.\n"
        "Answer the question by identifying which round has the highest total base stats.\n"
        "Wrap your final answer (round number) in <answer></answer>."),
    WEIGHTED_SUMMATION_ENV: (
        "You are analyzing a guess-the-Pokemon dialogue. Full conversation history with feedback is provided.\n"
        "Calculate the weighted scores for two rounds using this weighted rule:\n"
        "- Type: 6 points per correct item\n"
        "- Ability: 5 points per correct item\n"
        "- Base Stats: 4 points per correct item\n"
        "- Evolution: 3 points per correct item\n"
        "- Generation: 2 points per correct item\n"
        "- Other sections: 1 point per correct item\n"
        "Example: If a round has Type correct (6) + 2 Abilities correct (5+5) + 1 Evolution correct (3), "
        "score = 6+5+5+3 = 19.\n"
        "Then compute the absolute difference between the two rounds' scores.\n"
        "Wrap your final answer (difference value) in <answer></answer>."),
    FIND_DUPLICATES_TOOL: (
        "You are analyzing a guess-the-Pokemon dialogue. Full conversation history is provided.\n"
        "Answer the question with yes/no or true/false based on whether a Pokemon appears in both tool results.\n"
        "Wrap your final answer in <answer></answer>."),
    FIND_TARGET_OFFSETS_TOOL: (
        "You are analyzing a guess-the-Pokemon dialogue. Full conversation history is provided.\n"
        "Answer the question by identifying the two Pokemon names in order.\n"
        "Format your answer as: <answer>Pokemon1 and Pokemon2</answer>"),
    (INTERSECTION, "Verbose-Response"): (
        "You are reviewing a guess-the-Pokemon dialogue. Full history messages (including tool results) are "
        "provided; infer the intersection list for the target round's tool call. Each round is defined as: user "
        "guess -> optional tool call -> feedback. The first round has no tool call; the first tool call appears "
        "after the user's second guess (called round 2), and so on. Return only the intersection as a "
        "comma-separated list or JSON array. Do not call any tools. Wrap the final list in <answer></answer>."),
    (INTERSECTION, "Concise-Response"): (
        "You are an expert analyst for a deductive reasoning game. The full conversation history with system "
        "feedback is provided.\n"
        "Your task is to analyze the logical progression and constraints revealed throughout the dialogue to "
        "deduce the hidden target Pokemon.\n"
        "The correct answer must be logically consistent with the entire history of feedback.\n"
        "Return only the Pokemon name. Do not call any tools. Wrap your final answer in <answer></answer>."),
    None: ("You are analyzing a guess-the-Pokemon dialogue. Full conversation history is provided. Answer the "
           "question and wrap your final answer in <answer></answer>."),
}
_POKEMON[COUNT_CORRECTNESS_ENV] = _POKEMON[COUNT_FREQUENCY_TOOL]
_MASKED = {
    COUNT_FREQUENCY_TOOL: (
        "You are analyzing a masked guess-the-entity dialogue. Full conversation history (including tool results "
        "and feedback) is provided. Answer the question based on the tool return values or environment feedback. "
        "Wrap your final answer in <answer></answer>."),
    COUNT_FREQUENCY_ENV: (
        "You are analyzing a masked guess-the-entity dialogue. Full conversation history with feedback is "
        "provided.\n"
        "Answer the question by counting occurrences of a property value across all rounds' feedback.\n"
        "Wrap your final answer (a number) in <answer></answer>."),
    FIND_ROUND_LARGEST_VALUE_ENV: (
        "You are analyzing a masked guess-the-entity dialogue. Full conversation history with feedback is "
        "provided.\n"
        "Answer the question by identifying which round has the highest attr_2 total (numeric field).\n"
        "Wrap your final answer (round number) in <answer></answer>."),
    WEIGHTED_SUMMATION_ENV: (
        "You are analyzing a masked guess-the-entity dialogue. Full conversation history with feedback is "
        "provided.\n"
        "Calculate the weighted scores for two rounds using this weighted rule:\n"
        "- attr_1: 6 points per correct item\n"
        "- attr_4: 5 points per correct item\n"
        "- attr_2: 4 points per correct item\n"
        "- attr_5: 3 points per correct item\n"
        "- attr_3: 2 points per correct item\n"
        "- attr_6: 1 point per correct item\n"
        "Example: If a round has attr_1 correct (6) + 2 attr_4 items correct (5+5) + 1 attr_5 correct (3), "
        "score = 6+5+5+3 = 19.\n"
        "Then compute the absolute difference between the two rounds' scores.\n"
        "Wrap your final answer (difference value) in <answer></answer>."),
    FIND_DUPLICATES_TOOL: (
        "You are analyzing a masked guess-the-entity dialogue. Full conversation history is provided.\n"
        "Answer the question with yes/no or true/false based on whether an entity id appears in both tool "
        "results.\n"
        "Wrap your final answer in <answer></answer>."),
    FIND_TARGET_OFFSETS_TOOL: (
        "You are analyzing a masked guess-the-entity dialogue. Full conversation history is provided.\n"
        "Answer the question by identifying the two entity ids in order.\n"
        "Format your answer as: <answer>id1 and id2</answer>"),
    (INTERSECTION, "Verbose-Response"): (
        "You are reviewing a masked guess-the-entity dialogue. Full history messages (including tool results) are "
        "provided; infer the intersection list for the target round's tool call. Each round is defined as: user "
        "guess -> optional tool call -> feedback. The first round has no tool call; the first tool call appears "
        "after the user's second guess (called round 2), and so on. Return only the intersection as a "
        "comma-separated list or JSON array. Do not call any tools. Wrap the final list in <answer></answer>."),
    (INTERSECTION, "Concise-Response"): (
        "You are an expert analyst for a deductive reasoning game with masked ids. The full conversation history "
        "with system feedback is provided.\n"
        "Analyze the constraints to deduce the hidden target id (the intersection-consistent answer).\n"
        "Return only the masked id. Do not call any tools. Wrap your final answer in <answer></answer>."),
    None: ("You are analyzing a masked guess-the-entity dialogue. Full conversation history is provided. Answer "
           "the question and wrap your final answer in <answer></answer>."),
}
_MASKED[COUNT_CORRECTNESS_ENV] = _MASKED[COUNT_FREQUENCY_TOOL]


def system_prompt(question_type: str, knowledge: str, history: str) -> str:
    table = _MASKED if knowledge == "knowledge_free" else _POKEMON
    if question_type == INTERSECTION:
        return table.get((INTERSECTION, history), table[None])
    return table.get(question_type, table[None])


def path_labels(path: Path) -> tuple[str, str, str, str]:
    """(setting, knowledge label, history label, length) from `.../<k?-?>/<length>/...`."""
    parts = [p.lower() for p in path.parts]
    for i, part in enumerate(parts):
        if re.fullmatch(r"k[if]-[cv]", part):
            knowledge, history = part.split("-")
            length = parts[i + 1] if i + 1 < len(parts) else ""
            return part, KNOWLEDGE[knowledge], HISTORY[history], length
    raise UserError(f"{path}: cannot tell the setting (ki-c, ki-v, kf-c, kf-v) from the path; keep the "
                    f"benchmark/<setting>/<length>/<category>/<type>.jsonl layout")


def parse_subset(subset: str | None) -> tuple[bool, list[str]]:
    text = subset or DEFAULT_FILTER
    final_only = text.startswith("final:")
    text = text.removeprefix("final:") or DEFAULT_FILTER
    return final_only, [p.lower() for p in text.strip("/").split("/") if p]


def _matches(path: Path, root: Path, wanted: list[str]) -> bool:
    parts = [p.lower() for p in path.relative_to(root).parts]
    parts[-1] = parts[-1].removesuffix(".jsonl")
    return all(w in parts for w in wanted)


def _hub_root() -> Path:
    if not hub_reachable():
        raise UserError(offline_message("agentlongbench", HUB_ID))
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(HUB_ID, repo_type="dataset", allow_patterns=["benchmark/**"]))
    except Exception as err:  # the hub client raises many types (connection, auth, missing repo)
        raise UserError(f"agentlongbench: cannot download {HUB_ID} ({str(err).splitlines()[0]}); download it "
                        f"where the hub is reachable and pass --data-path <its directory>") from err


def _data_root(options: LoadOptions) -> Path:
    if options.data_path is None:
        raise UserError(f"agentlongbench is not bundled (hub only): pass --data-path hub to download {HUB_ID}, or "
                        f"--data-path <dir> with a copy (`huggingface-cli download --repo-type dataset {HUB_ID} "
                        f"--local-dir DIR` on a networked machine)")
    if wants_hub(options.data_path) and options.data_path == HUB_WORD:
        return _hub_root()
    return local_path(options.data_path)


def sample_trajectory(row: dict, where: str, path: Path, final_only: bool) -> Trajectory:
    setting, knowledge, history, length = path_labels(path)
    question_type = row.get("question_type")
    if question_type not in QUESTION_TYPES:
        raise UserError(f"{where}: 'question_type' {question_type!r} is not an AgentLongBench question type")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise UserError(f"{where}: record has no non-empty 'question'")
    rollout = row.get("messages")
    if not isinstance(rollout, list):
        raise UserError(f"{where}: 'messages' must be a list (the rollout)")
    messages = [{"role": "system", "content": system_prompt(question_type, knowledge, history)}]
    messages += [m for m in rollout if not (isinstance(m, dict) and m.get("role") == "system")]
    messages.append({"role": "user", "content": question})
    sample_id = f"agentlongbench-{setting}-{length}-{row.get('id', row.get('sample_id'))}"
    meta = {"question_type": question_type, "setting": setting, "length": length}
    trajectory = conversation_trajectory(sample_id, messages, where, trailing_turn=True, meta=meta)
    if final_only:
        history_messages = [m for t in trajectory.turns for m in t.new_messages + [t.logged_reply] if m is not None]
        trajectory.turns = [Turn(new_messages=history_messages)]
    return trajectory


TASK = describe("agentlongbench")  # tasks/agentlongbench/task.toml: name, licence, source, subsets, turns, scoring


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    final_only, wanted = parse_subset(options.subset)
    root = _data_root(options)
    files = [root] if root.is_file() else sorted(root.rglob("*.jsonl"))
    files = [f for f in files if root.is_file() or _matches(f, root, wanted)]
    if not files:
        raise UserError(f"agentlongbench: no .jsonl files under {root} match --subset {options.subset or DEFAULT_FILTER}")
    trajectories = []
    for path in files:
        for where, row in read_records(path):
            trajectories.append(sample_trajectory(row, where, path, final_only))
    return seeded_subset(trajectories, options.limit, options.seed)
