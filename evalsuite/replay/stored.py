"""The contexts of a stored run, rebuilt from its run.json and stored outputs without a model (`evalsuite compare`,
`evalsuite label`): the run's replay mode replays every turn with the run's own stored replies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from evalsuite.conventions import SKIPPED
from evalsuite.errors import UserError
from evalsuite.replay.base import ReplaySetup, replay_type
from evalsuite.replay.context import STOP, TurnContext, Window, make_policy
from evalsuite.tasks.base import LoadOptions, get_task

REPO_ROOT = Path(__file__).resolve().parents[2]


def stored_contexts(config: dict, turns, chat, pairs: Iterable[tuple[str, str]] | None = None
                    ) -> dict[tuple[str, str, int], TurnContext]:
    """The context every turn of a stored run saw, keyed (method, sample_id, turn), rebuilt as the runner built it:
    the task's data as run.json loaded it (limit, seed, data path, subset), the run's replay mode, context policy and
    window, the target's template (`chat`: a `ChatTokenizer`, no weights needed; it must hash as the run's did), and
    after each turn the run's own stored reply (`MethodReplay.replay_stored`), so free replay continues from it.
    `turns`: the run's turns table (`store.read_run(...).turns`); `pairs`: the (method, sample) pairs to rebuild (all
    the table's when None), every turn up to max_turns. A sample no longer in the task's data has no contexts."""
    check_chat(chat, config)
    task = get_task(config["task"])
    mode = config.get("replay")
    mode_class = replay_type(task.default_replay if mode in (None, "", "auto") else mode)
    if mode_class.not_rebuilt:
        raise UserError(mode_class.not_rebuilt)
    trajectories = task.load(LoadOptions(config.get("limit"), config.get("seed", 0),
                                         _run_path(config.get("data_path")), config.get("subset"),
                                         config.get("format")))
    by_id = {t.sample_id: t for t in trajectories}
    window = Window(int(config.get("target_max_context") or chat.max_context), int(config.get("max_new_tokens", 256)),
                    int(config.get("k", 7)))
    thinking = bool(config.get("enable_thinking"))
    setup = ReplaySetup(make_policy(config.get("context_policy", STOP), window),
                        lambda t: (lambda messages: chat.render(messages, t.tools, thinking)),
                        config.get("max_turns"), config.get("context_points"), config["task"])
    rows = {(r.method, r.sample_id, int(r.turn)): r for r in turns.itertuples(index=False)}
    if pairs is None:
        pairs = {(m, s) for m, s, _ in rows}
    found = {}
    for method, sample in sorted(set(pairs)):
        trajectory = by_id.get(sample)
        if trajectory is None:
            continue
        replay = mode_class.for_trajectory(trajectory, (method,), setup)[method]
        index = 0
        while replay.has_turn(index):
            row = rows.get((method, sample, index))
            stored = row is not None and row.stop_reason != SKIPPED and row.output_ids is not None
            text = chat.decode(list(row.output_ids)) if stored else None
            found[(method, sample, index)] = replay.replay_stored(index, text)
            index += 1
    return found


def check_chat(chat, config: dict) -> None:
    """The tokenizer and chat template must be the run's (run.json's hashes), else the rebuilt contexts are not the
    ones the run decoded from."""
    for name, value in chat.hashes().items():
        recorded = config.get(name)
        if recorded and recorded != value:
            what = name.removesuffix("_sha256").replace("_", " ")
            raise UserError(f"target {chat.name}: its {what} hashes to {value}, the run recorded {recorded}; it is "
                            "not the run's target, so the run's contexts cannot be rebuilt (pass the run's target)")


def _run_path(value: str | None) -> str | None:
    """A path as run.json records it (`config.portable_paths`: relative to the repository, or `~/…`)."""
    if not value:
        return value
    path = Path(value).expanduser()
    if not path.is_absolute() and not path.exists() and (REPO_ROOT / path).exists():
        return str(REPO_ROOT / path)
    return str(path) if path.exists() else value
