"""LongBench v2: one long turn, `{context}\\n\\nQuestion: {question}` as DLite's benchmark sends it (docs/methods.md §1.3).

`--subset` picks a domain by the names of DLite's five shards (single_document_qa, multi_document_qa,
long_dialogue, in_context_learning, code_repo) or structured_data (the sixth domain, not in DLite's runs).
DLite's shards also keep only contexts of 32k-64k target tokens; no token filter is applied here.

`--context-points`: each item is decoded once per point, its context cut to the longest prefix that keeps the
rendered prompt (context prefix, then the question) within the point, so the points of one item are nested contexts
of one document (LongBench's own scripts cut the middle instead, to fit one window).

Bundled: 17 real items with full contexts (`tasks/longbench_v2`, index.jsonl + items/). `--data-path` takes the
official `data.json` (a JSON array with `context`) or a JSON Lines export; `hub` loads THUDM/LongBench-v2 train.
"""

from __future__ import annotations


from evalsuite.errors import UserError
from evalsuite.tasks._source import HubSpec, hub_rows, local_path, read_records, text_field, wants_hub, \
    HUB as HUB_WORD
from evalsuite.tasks.base import LoadOptions, Trajectory, Turn, register_task, seeded_subset
from evalsuite.tasks.description import describe

PROMPT = "{context}\n\nQuestion: {question}"
HUB = HubSpec("THUDM/LongBench-v2", split="train")
TASK = describe("longbench-v2")  # tasks/longbench_v2/task.toml: name, licence, source, files, subsets, turns
BUNDLED = TASK.folder
SUBSETS = {
    "single_document_qa": "Single-Document QA",
    "multi_document_qa": "Multi-Document QA",
    "long_dialogue": "Long-dialogue History Understanding",
    "in_context_learning": "Long In-context Learning",
    "code_repo": "Code Repository Understanding",
    "structured_data": "Long Structured Data Understanding",
}


def _bundled_rows() -> list[tuple[str, dict]]:
    """The index lists all 503 items; only those whose context file is bundled can run."""
    rows = []
    for where, row in read_records(TASK.file("index.jsonl")):
        if not row.get("context_shipped"):
            continue
        context_path = BUNDLED / "items" / text_field(row, "context_file", where)
        try:
            context = context_path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UserError(f"{where}: cannot read its context {context_path} ({err})") from err
        rows.append((where, {**row, "context": context}))
    return rows


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    if options.subset is not None and options.subset not in SUBSETS:
        raise UserError(f"--subset {options.subset}: longbench-v2 has subsets {', '.join(SUBSETS)}")
    if wants_hub(options.data_path):
        rows = hub_rows("longbench-v2", HUB if options.data_path == HUB_WORD else HubSpec(options.data_path,
                                                                                          split=HUB.split))
    elif options.data_path:
        rows = read_records(local_path(options.data_path))
    else:
        rows = _bundled_rows()
    domain = SUBSETS.get(options.subset) if options.subset else None
    items = []
    for index, (where, row) in enumerate(rows):
        if domain and row.get("domain") != domain:
            continue
        context = text_field(row, "context", where)
        prompt = PROMPT.format(context=context, question=text_field(row, "question", where))
        items.append((f"longbench-v2-{row.get('_id') or index}", prompt, len(context)))
    if not items:
        raise UserError(f"longbench-v2: no items for --subset {options.subset}")
    chosen = seeded_subset(items, options.limit, options.seed)
    # the context may be cut to a prefix, the question kept: --context-points decodes each item at every point
    return [Trajectory(sample_id, [Turn([{"role": "user", "content": prompt}], cut_at=cut)],
                       meta={"subset": options.subset or "all"}) for sample_id, prompt, cut in chosen]
