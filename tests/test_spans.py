"""Span labels (evalsuite.spans): kinds of planted replies, copy lengths, character offsets; the spans table in the
run store (parts with their turn, parts added afterwards, duplicates, orphans, compaction)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from evalsuite import spans
from evalsuite.report.spans import load_spans
from evalsuite.spans import (SPANS_SCHEMA, SPANS_TABLE, SpanRecord, char_kinds, copy_lengths, label_turn, span_rows,
                             token_char_spans)
from evalsuite.store.records import TurnRecord
from evalsuite.store.run_store import RunStore, read_run, write_added
from tests.helpers import turn, write_run

END = 1  # the fake tokenizer's end-of-turn token


class CharTokenizer:
    """One token per character (id = code point + 10) and one special end-of-turn token."""

    all_special_ids = [END]

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 10 for c in text]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(("" if skip_special_tokens else "<|im_end|>") if i == END else chr(i - 10) for i in ids)


def kinds_of(text: str, task: str = "", end: bool = False) -> list[tuple[str, str]]:
    """(kind, text) runs of a planted reply labelled token by token."""
    tok = CharTokenizer()
    ids = tok.encode(text) + ([END] if end else [])
    record = label_turn(ids, [], tok, task=task, method="m", sample_id="s", turn=0)
    decoded = [tok.decode([i]) for i in ids]
    runs: list[tuple[str, str]] = []
    for kind, piece in zip(record.kind, decoded):
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1] + piece)
        else:
            runs.append((kind, piece))
    return runs


# ---- kinds ---------------------------------------------------------------------------------------------------------
def test_tool_call_json_is_a_tool_call_and_the_end_token_other():
    reply = 'Let me list the files.\n<tool_call>{"name": "ls", "arguments": {"a": "x}"}}</tool_call>'
    assert kinds_of(reply, end=True) == [
        ("prose", "Let me list the files.\n"),
        ("tool_call", '<tool_call>{"name": "ls", "arguments": {"a": "x}"}}</tool_call>'),
        ("other", "<|im_end|>")]


def test_bare_json_object_and_bfcl_call_list_are_tool_calls():
    assert kinds_of('{"name": "cd", "arguments": {"folder": "doc]s"}}\nDone.') == [
        ("tool_call", '{"name": "cd", "arguments": {"folder": "doc]s"}}\n'), ("prose", "Done.")]
    assert kinds_of("[cd(folder='a)b'), ls(a=1)]") == [("tool_call", "[cd(folder='a)b'), ls(a=1)]")]
    # a bare call line is a call only where the task says so (BFCL)
    assert kinds_of("mv(source='a', destination='b')", task="bfcl-v3") == \
        [("tool_call", "mv(source='a', destination='b')")]
    assert kinds_of("mv(source='a', destination='b')")[0][0] == "prose"


def test_fenced_code_and_bash_blocks_are_code():
    reply = ("THOUGHT: I will look at the file first.\n\n```bash\ncat django/utils/dateparse.py\n```\n"
             "Then I fix it:\n```python\ndef f(x):\n    return x\n```")
    assert kinds_of(reply) == [
        ("prose", "THOUGHT: I will look at the file first.\n\n"),
        ("code", "```bash\ncat django/utils/dateparse.py\n```\n"),
        ("prose", "Then I fix it:\n"),
        ("code", "```python\ndef f(x):\n    return x\n```")]


def test_json_fence_is_structured_and_a_cut_fence_runs_to_the_end():
    assert kinds_of('```json\n{"a": 1}\n```')[0] == ("tool_call", '```json\n{"a": 1}\n```')
    assert kinds_of("Run:\n```bash\nls -la\ngrep -rn") == [("prose", "Run:\n"), ("code", "```bash\nls -la\ngrep -rn")]
    assert kinds_of("$ pip install evalsuite\nThat installs it.") == [
        ("code", "$ pip install evalsuite\n"), ("prose", "That installs it.")]


def test_prose_and_other():
    assert kinds_of("She sold 16 - 3 - 4 = 9 eggs.\n#### 18") == [
        ("prose", "She sold 16 - 3 - 4 = 9 eggs.\n"), ("other", "#### 18")]
    assert char_kinds("") == []
    assert set(char_kinds("\n\n")) == {"other"}


def test_a_token_takes_the_kind_of_most_of_its_characters():
    text = "Hi there\n```bash\nls\n```"
    pieces = [text[i:i + 2] for i in range(0, len(text), 2)]  # two characters per token

    class PairTokenizer:  # token id i decodes to pieces[i]
        all_special_ids: list[int] = []

        def decode(self, token_ids, skip_special_tokens=False):
            return "".join(pieces[i] for i in token_ids)

    record = label_turn(list(range(len(pieces))), [], PairTokenizer(), task="", method="m", sample_id="s", turn=0)
    # "\n`" is half prose, half code: the tie goes to its first character; "``" is code
    assert list(zip(pieces, record.kind))[:6] == [("Hi", "prose"), (" t", "prose"), ("he", "prose"),
                                                  ("re", "prose"), ("\n`", "prose"), ("``", "code")]


# ---- character offsets ---------------------------------------------------------------------------------------------
def test_char_spans_cover_the_decoded_text_and_split_characters():
    from evalsuite.testing import byte_tokenizer

    tok = byte_tokenizer()
    text = "café → ok 🙂\n```bash\nls\n```"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    decoded, starts, ends = token_char_spans(lambda x: tok.decode(x), ids)
    assert decoded == text == tok.decode(ids)
    assert len(ids) > len(text)  # multi-byte characters take several byte tokens
    assert starts[0] == 0 and ends[-1] == len(text)
    assert all(s <= e for s, e in zip(starts, ends)) and all(e == s for s, e in zip(starts[1:], ends))
    empty = [i for i, (s, e) in enumerate(zip(starts, ends)) if s == e]
    assert empty  # the first bytes of é, →, 🙂 add no character of their own ...
    record = label_turn(ids, [], tok, task="", method="m", sample_id="s", turn=0)
    assert all(record.kind[i] == "prose" for i in empty)  # ... and take the kind of the character they form
    assert record.kind[-1] == "code"


# ---- copy lengths --------------------------------------------------------------------------------------------------
def test_a_copied_span_gets_copy_lengths_rising_to_its_length():
    context = list(range(100, 400))
    reply = list(range(1000, 1010)) + context[50:70] + list(range(2000, 2010))
    copied, from_context = copy_lengths(context, reply)
    assert copied[:10] == [0] * 10
    assert copied[10:30] == list(range(1, 21)) == from_context[10:30]
    assert copied[30:] == [0] * 10
    record = SpanRecord("r", "m", "t", "s", 0, len(context), "", len(reply), ["prose"] * len(reply), copied, from_context)
    assert sum(record.copied) == 20 - 7  # positions 8 … 20 of the span reach the threshold of 8


def test_a_novel_reply_gets_short_copy_lengths():
    rng = random.Random(0)
    context = [rng.randrange(5000) for _ in range(3000)]
    reply = [rng.randrange(5000) for _ in range(200)]
    copied, _ = copy_lengths(context, reply)
    assert max(copied) <= 2 and sum(c >= spans.DEFAULT_THRESHOLD for c in copied) == 0


def test_repeating_the_reply_itself_counts_but_not_as_context():
    context = [1, 2, 3]
    reply = [7, 8, 9, 10, 7, 8, 9, 10]
    copied, from_context = copy_lengths(context, reply)
    assert copied == [0, 0, 0, 0, 1, 2, 3, 4]
    assert from_context == [0] * 8


def _brute(context, reply):
    sequence = context + reply
    copied, from_context = [], []
    for i in range(len(reply)):
        j = len(context) + i
        best = best_context = 0
        for length in range(1, j + 1):
            piece = sequence[j - length + 1: j + 1]
            earlier = [e for e in range(length - 1, j) if sequence[e - length + 1: e + 1] == piece]
            if not earlier:
                break
            best = length
            if any(e < len(context) for e in earlier):
                best_context = length
        copied.append(best)
        from_context.append(best_context)
    return copied, from_context


@pytest.mark.parametrize("seed", range(6))
def test_copy_lengths_match_a_brute_force_search(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5])
    context = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 40))]
    reply = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 40))]
    assert copy_lengths(context, reply) == _brute(context, reply)


# ---- the table -----------------------------------------------------------------------------------------------------
def _record(method="m", sample="s", turn=0, n=3, version=spans.LABELLER_VERSION):
    return SpanRecord("run", method, "task", sample, turn, 5, "abc", n, ["prose"] * n, [0] * n, [0] * n,
                      labeller_version=version)


def _run(tmp_path, samples=("s", "t"), turns=2):
    return write_run(tmp_path / "run", "gsm8k", {"m": {s: [turn([(3, 1)]) for _ in range(turns)] for s in samples}})


def test_spans_parts_land_with_their_turn_and_orphans_are_not_read(tmp_path):
    store = RunStore(tmp_path)
    store.prepare()
    record = TurnRecord(run_id="run", method="m", task="task", sample_id="s", turn=0, replay="free", context_len=5,
                        prompt_tokens=5, new_tokens=3, stop_reason="eos", output_ids=[1, 2, 3], last=True)
    store.write_turn("s", 0, [], [record], extra={SPANS_TABLE: (span_rows([_record(turn=0)]), SPANS_SCHEMA)})
    loaded = load_spans(tmp_path)
    assert list(loaded.columns) == SPANS_SCHEMA.names and len(loaded) == 1
    assert list(loaded.kind[0]) == ["prose"] * 3 and list(loaded.copy_len[0]) == [0, 0, 0]
    # a spans part whose turns part never landed (killed between the renames) is an orphan: not read, cleaned
    (part,) = (tmp_path / "spans.parquet").glob("[!.]*.parquet")
    orphan = part.with_name("0123456789abcdef.parquet")
    orphan.write_bytes(part.read_bytes())
    assert len(load_spans(tmp_path)) == 1
    assert store.clean() == [orphan] and not orphan.exists()


def test_added_parts_are_read_kept_deduplicated_and_compacted(tmp_path):
    run = _run(tmp_path)
    assert load_spans(run).empty
    write_added(run, SPANS_TABLE, "a1", span_rows([_record(sample="s", turn=0), _record(sample="s", turn=1)]),
                SPANS_SCHEMA)
    with pytest.raises(FileExistsError):
        write_added(run, SPANS_TABLE, "a1", span_rows([_record()]), SPANS_SCHEMA)
    # the same turn labelled twice (two labellers at once): one row; another labeller version sits beside, unread
    write_added(run, SPANS_TABLE, "a2", span_rows([_record(sample="s", turn=0),
                                                   _record(sample="t", turn=0, version="spans-v0")]), SPANS_SCHEMA)
    assert sorted(load_spans(run).turn) == [0, 1] and set(load_spans(run).sample_id) == {"s"}
    assert len(load_spans(run, version="spans-v0")) == 1
    assert RunStore(run).leftovers() == []  # added parts belong to no turn group, and are no orphans
    assert not list((run / "spans.parquet").glob(".*"))  # no temporary file left behind
    before = load_spans(run)
    assert RunStore(run).compact() > 0
    assert [p.name.startswith("compact-") for p in (run / "spans.parquet").iterdir()] == [True]
    after = load_spans(run)
    assert after.drop(columns=["kind", "copy_len", "context_copy_len"]).equals(
        before.drop(columns=["kind", "copy_len", "context_copy_len"]))
    assert [list(k) for k in after.kind] == [list(k) for k in before.kind]
    # a compacted run labelled later: the added part is read, and a second compaction merges it in
    write_added(run, SPANS_TABLE, "a3", span_rows([_record(sample="t", turn=1)]), SPANS_SCHEMA)
    assert len(load_spans(run)) == 3
    assert RunStore(run).compact() == 2 and len(list((run / "spans.parquet").iterdir())) == 1
    assert len(load_spans(run)) == 3 and len(read_run(run).turns) == 4


def test_the_labeller_imports_no_torch():
    code = "import sys, evalsuite.spans, evalsuite.report.spans; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_a_reader_beside_a_compacting_writer_reads_a_whole_snapshot(tmp_path, monkeypatch):
    """A part listed and then removed before it is read (a writer compacting beside the reader, as the progress
    line or kill_resume's reader meets it): the reader lists again instead of failing."""
    import pyarrow.parquet as pq

    from evalsuite.store import run_store as store_module

    run = _run(tmp_path)
    expected = len(read_run(run).turns)
    real, calls = pq.read_table, []

    def vanishing(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:  # the first read finds its part gone: compacted away meanwhile
            RunStore(run).compact()
            raise FileNotFoundError(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(store_module.pq, "read_table", vanishing)
    assert len(read_run(run).turns) == expected
