"""MemoryAgentBench (Hu et al., ICLR 2026): long contexts with many questions each, DLite's acceptance prompts.

Data (hub only, not bundled): `ai-hyz/MemoryAgentBench` on the Hugging Face hub, splits Accurate_Retrieval,
Test_Time_Learning, Long_Range_Understanding, Conflict_Resolution; rows `{context, questions[], answers[][],
metadata{source, question_ids, qa_pair_ids, ...}}`. `--data-path` also takes a Parquet/JSONL file of such rows
or a directory of Parquet files (the HF `data/` folder, or DLite's `MemoryAgentBench/data` folder).

Requests follow DLite's `evaluation/memoryagentbench_acceptance.py` (FlashMTP @ 8988495): for each context,
evenly spaced questions (50 per context for factconsolidation_64k, 10 for eventqa_64k, all for
detectiveqa_free), each sent as `[system, user]` with DLite's prompt strings, byte for byte. MemoryAgentBench's
own long-context agent likewise concatenates the memorized chunks into one prompt per question, so each
request is one turn; requests of one context share its long prefix.

`--subset` picks DLite's category: factconsolidation_64k, eventqa_64k or detectiveqa_free (default: all three).
Rows are matched by `metadata.source` (factconsolidation_*_64k, eventqa_65536, detective_qa) or, for DLite's
own files, by file name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from evalsuite.errors import UserError
from evalsuite.tasks._source import HUB as HUB_WORD, HubSpec, hub_rows, local_path, read_records, wants_hub
from evalsuite.tasks.base import LoadOptions, Trajectory, Turn, register_task, seeded_subset
from evalsuite.tasks.description import describe

HUB_ID = "ai-hyz/MemoryAgentBench"
SYSTEM_MESSAGE = "You are a helpful assistant that can read a long context and answer questions based on it."
DETECTIVE_MARKER = "Now Answer the Question:"


@dataclass(frozen=True)
class Category:
    split: str  # the HF split holding its rows
    source: re.Pattern  # metadata.source of its rows
    dlite_file: str  # DLite's file name for it
    per_context: int | None  # questions per context, evenly spaced; None = all


CATEGORIES = {
    "factconsolidation_64k": Category("Conflict_Resolution", re.compile(r"factconsolidation_.*64k"),
                                      "FactConsolidation_64K_Qwen3-00000-of-00001.parquet", 50),
    "eventqa_64k": Category("Accurate_Retrieval", re.compile(r"eventqa_65536"),
                            "EventQA_64K_Qwen3-00000-of-00001.parquet", 10),
    "detectiveqa_free": Category("Long_Range_Understanding", re.compile(r"detective_qa"),
                                 "DetectiveQA_le120K_Qwen3-00000-of-00001.parquet", None),
}


def evenly_spaced(length: int, count: int | None) -> list[int]:
    """`count` indices over range(length), both ends included, as DLite picks questions."""
    if count is None or count >= length:
        return list(range(length))
    if count == 1:
        return [0]
    return [round(i * (length - 1) / (count - 1)) for i in range(count)]


def detective_stem(question: str, where: str) -> str:
    """The free-answer question: the text after the worked example, without the choices or `Output:`."""
    if DETECTIVE_MARKER not in question:
        raise UserError(f"{where}: DetectiveQA question lacks the {DETECTIVE_MARKER!r} marker")
    stem = question.split(DETECTIVE_MARKER, 1)[1]
    stem = re.split(r"\n\s*A\.\s", stem, maxsplit=1)[0]
    stem = re.sub(r"\s*Output:\s*$", "", stem).strip()
    if not stem:
        raise UserError(f"{where}: DetectiveQA question is empty once its choices are removed")
    return stem


def user_prompt(category: str, context: str, question: str, where: str) -> str:
    if category == "factconsolidation_64k":
        return ("The following context is a knowledge pool. Facts have serial numbers, and a larger serial number "
                "means a newer fact. Resolve conflicts using the newest applicable facts and answer the question "
                f"from this knowledge pool.\n\n[Knowledge Pool]\n{context}\n\nQuestion: {question}\nAnswer:")
    if category == "eventqa_64k":
        return ("Read the following book context, then predict the event requested by the question.\n\n"
                f"[Book Context]\n{context}\n\n{question}\n\nAnswer:")
    stem = detective_stem(question, where)
    return ("Read the following detective story and answer the question using a free-form response. No answer "
            "choices are provided. Explain your answer based on evidence from the story.\n\n"
            f"[Story]\n{context}\n\nQuestion: {stem}\nAnswer:")


def _source(row: dict) -> str:
    metadata = row.get("metadata") or {}
    return str(metadata.get("source", "")) if isinstance(metadata, dict) else ""


def _rows_for(category: str, options: LoadOptions) -> list[tuple[str, dict]]:
    spec = CATEGORIES[category]
    if options.data_path is None:
        raise UserError(f"agentmemorybench is not bundled (hub only): pass --data-path hub to load {HUB_ID}, or "
                        f"--data-path <dir or file> with a copy (`huggingface-cli download --repo-type dataset "
                        f"{HUB_ID} --local-dir DIR` on a networked machine)")
    if wants_hub(options.data_path):
        hub_id = HUB_ID if options.data_path == HUB_WORD else options.data_path
        rows = hub_rows("agentmemorybench", HubSpec(hub_id, split=spec.split))
        return [(w, r) for w, r in rows if spec.source.search(_source(r))]
    path = local_path(options.data_path)
    if path.is_dir():
        dlite = path / spec.dlite_file
        if dlite.exists():
            return read_records(dlite)  # DLite's per-category file: every row belongs to the category
        files = sorted(path.rglob("*.parquet")) + sorted(path.rglob("*.jsonl"))
        if not files:
            raise UserError(f"--data-path {path}: no .parquet or .jsonl files of MemoryAgentBench rows in it")
        rows = [r for f in files for r in read_records(f)]
    else:
        rows = read_records(path)
    return [(w, r) for w, r in rows if spec.source.search(_source(r))]


def category_trajectories(category: str, rows: list[tuple[str, dict]]) -> list[Trajectory]:
    out = []
    for context_index, (where, row) in enumerate(rows):
        context, questions = row.get("context"), row.get("questions")
        if not isinstance(context, str) or not context.strip():
            raise UserError(f"{where}: record has no non-empty 'context'")
        if not isinstance(questions, list) or not questions or not all(isinstance(q, str) for q in questions):
            raise UserError(f"{where}: 'questions' must be a non-empty list of strings")
        for q in evenly_spaced(len(questions), CATEGORIES[category].per_context):
            prompt = user_prompt(category, context, questions[q], f"{where} question {q}")
            messages = [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": prompt}]
            out.append(Trajectory(f"agentmemorybench-{category}-c{context_index}-q{q}", [Turn(messages)],
                                  meta={"category": category, "source": _source(row)}))
    return out


TASK = describe("agentmemorybench")  # tasks/agentmemorybench/task.toml: name, licence, source, subsets, turns, scoring


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    if options.subset is not None and options.subset not in CATEGORIES:
        raise UserError(f"--subset {options.subset}: agentmemorybench has subsets {', '.join(CATEGORIES)}")
    categories = [options.subset] if options.subset else list(CATEGORIES)
    trajectories = []
    for category in categories:
        trajectories += category_trajectories(category, _rows_for(category, options))
    if not trajectories:
        raise UserError(f"agentmemorybench: no rows of {', '.join(categories)} in --data-path {options.data_path}")
    return seeded_subset(trajectories, options.limit, options.seed)
