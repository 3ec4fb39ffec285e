"""benchmarks/draft_cost.py on the random-target code path at toy sizes (`--tiny`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "draft_cost.py"


@pytest.fixture(scope="module")
def draft_cost():
    return load_script(SCRIPT, "draft_cost")


def test_tiny_random_target_run_reports_history_and_working_state(draft_cost, capsys):
    contexts, warmup, steps = (32, 96), 1, 2
    rows = draft_cost.main(["--target", "qwen3-8b-random", "--tiny", "--contexts", ",".join(map(str, contexts)),
                            "--warmup", str(warmup), "--steps", str(steps), "--methods", "eagle3;dlite",
                            "--threads", "1"])
    table = capsys.readouterr().out
    assert table.startswith("| method | context |") and len(table.strip().splitlines()) == 2 + len(rows)
    by = {(r.method, r.context): r for r in rows}
    shape = draft_cost.TINY_SHAPE
    entry = 2 * shape["num_key_value_heads"] * shape["head_dim"] * 4  # one K and one V row, fp32
    for n in contexts:
        # one draft-cache entry per target feature: the context plus one per committed step
        assert by["eagle3", n].history_bytes == (n + warmup + steps) * entry
        assert by["dlite", n].history_bytes == 0
        assert by["eagle3", n].drafted == 7 and by["eagle3", n].propose_ms > 0
    assert by["dlite", 32].working_bytes == by["dlite", 96].working_bytes


def test_method_variants_parse(draft_cost):
    assert draft_cost.parse_method("eagle3:format=specforge:draft_vocab_size=32000") == (
        "eagle3:format=specforge:draft_vocab_size=32000", "eagle3",
        {"drafter": "random", "format": "specforge", "draft_vocab_size": 32000})
