"""Every task is registered from its declarative description, tasks/<task>/task.toml (evalsuite/tasks/description.py):
the description exists, names the task, its data files exist, the registry carries its fields, and `evalsuite tasks`
shows them."""

from __future__ import annotations

import pytest
from rich.console import Console
from typer.testing import CliRunner

import evalsuite.cli
from evalsuite.cli import app
from evalsuite.tasks import description as descriptions
from evalsuite.tasks.base import DATA_DIR, TASKS, get_task
from evalsuite.tasks.description import describe

get_task("gsm8k")  # registers every adapter
BUILT_IN = sorted(TASKS)  # every registered task (no plug-ins here)
NOT_TASKS = {"training"}  # tasks/training/: the drafters' training inputs (not a task)


def test_every_task_is_registered_from_its_description():
    assert len(BUILT_IN) >= 13
    for name in BUILT_IN:
        info = TASKS[name]
        description = info.description
        assert description is not None and not description.missing, name
        assert description.path == DATA_DIR / name.replace("-", "_") / "task.toml"
        assert (info.name, info.summary, info.licence, info.source, info.default_replay, info.formats) == (
            description.name, description.summary, description.licence, description.source,
            description.default_replay, description.formats), name
        assert info.subsets == description.subset_names and info.turns and info.scoring, name
        assert description.default_subset in (None, *description.subset_names), name


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_data_files_of_every_description_exist(name):
    description = TASKS[name].description
    missing = [str(path) for path in description.data_files() if not path.exists()]
    assert not missing, f"{description.path} names data files that are not there: {missing}"
    if description.bundled:
        assert description.files, f"{description.path}: a bundled task names its default data files"


def test_every_task_folder_is_a_registered_task_with_a_readme():
    folders = {p.name for p in DATA_DIR.iterdir() if p.is_dir()} - NOT_TASKS
    assert folders == {name.replace("-", "_") for name in BUILT_IN}
    assert (DATA_DIR / "README.md").is_file()
    for name in BUILT_IN:
        description = TASKS[name].description
        if description.bundled:  # the bundled data's provenance: source, licence, format
            assert list(description.folder.rglob("README*.md")), name


def test_the_adapters_read_the_files_their_descriptions_name():
    from evalsuite.tasks import _swebench_data, agentmemorybench, alpaca, longbench_v2, swebench
    from evalsuite.tasks.bfcl_v3 import data as bfcl

    swe = describe("swebench")
    assert swebench.BUNDLED["mini-swe-agent"] == swe.data_file("mini-swe-agent")
    assert swebench.PROMPT_FIXTURE == swe.data_file("oracle")
    assert [_swebench_data.BUNDLED_LITE, _swebench_data.BUNDLED_LITE_DEV] == [swe.file(f) for f in
                                                                             swe.subset("lite").files]
    assert _swebench_data.BUNDLED_RESULTS in swe.data_files()
    assert alpaca.BUNDLED == {s.name: alpaca.TASK.file(s.files[0]) for s in alpaca.TASK.subsets}
    assert tuple(longbench_v2.SUBSETS) == longbench_v2.TASK.subset_names  # names → the domains they filter on
    assert tuple(agentmemorybench.CATEGORIES) == agentmemorybench.TASK.subset_names
    assert bfcl.SUBSETS == ("base", "long_context") and bfcl.BUNDLED == bfcl.TASK.folder


def test_tasks_command_shows_the_description_fields(monkeypatch):
    monkeypatch.setattr(evalsuite.cli, "out", Console(width=2000))
    listed = CliRunner().invoke(app, ["tasks"], catch_exceptions=False)
    assert listed.exit_code == 0
    for name in BUILT_IN:
        info = TASKS[name]
        for text in (info.name, info.licence, info.turns, info.scoring):
            assert text in listed.output, (name, text)
    one = CliRunner().invoke(app, ["tasks", "bfcl-v3"], catch_exceptions=False)
    assert one.exit_code == 0
    assert "--subset long_context" in one.output and "BFCL_v3_multi_turn_long_context.json" in one.output
    assert "state-based check" in one.output and "task.toml" in one.output
    assert CliRunner().invoke(app, ["tasks", "gsm8kk"]).exit_code != 0  # an unknown task: did you mean


def test_a_malformed_description_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(descriptions, "DATA_DIR", tmp_path)
    (tmp_path / "toy_qa").mkdir()
    path = tmp_path / "toy_qa" / "task.toml"
    good = ('name = "toy-qa"\nsummary = "s"\nlicence = "MIT"\nsource = "here"\nfiles = ["a.jsonl"]\n'
            'turns = "single turn"\nscoring = "none"\n')
    path.write_text(good)
    toy = describe("toy-qa")
    assert toy.data_file() == tmp_path / "toy_qa" / "a.jsonl" and toy.default_replay == "free" and toy.bundled
    path.write_text(good + 'colour = "red"\n')
    with pytest.raises(ValueError, match="unknown keys colour"):
        describe("toy-qa")
    path.write_text(good.replace('"toy-qa"', '"toy"'))
    with pytest.raises(ValueError, match="the folder is that of task 'toy-qa'"):
        describe("toy-qa")
    path.write_text(good + 'default_replay = "closed"\n')
    with pytest.raises(ValueError, match="default_replay"):
        describe("toy-qa")
    path.unlink()
    assert describe("toy-qa").missing  # an install without its bundled data: said, not raised
