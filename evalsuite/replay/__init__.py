"""Replay and context policy: a trajectory → the context the target sees at each turn, for one method.

- `context.py`: the target's window, the context policies (`stop`, `truncate-left`) and `TurnContext`, what a replay
  hands the runner each turn.
- `base.py`: the replay protocol (`MethodReplay`) and the registry of replay modes by name (`replay_type`).
- One module per mode: `logged.py` (the logged replies), `free.py` (the model's own), `closed.py` (the model as an
  agent in its task's environment).
- `stored.py`: the contexts of a stored run, rebuilt from its stored replies (`evalsuite compare`, `evalsuite label`).

Importing the package registers every mode.
"""

from evalsuite.replay.base import REPLAYS, MethodReplay, ReplaySetup, replay_type
from evalsuite.replay.closed import ClosedReplay
from evalsuite.replay.context import (STOP, TRUNCATE_LEFT, ContextPolicy, Render, TurnContext, Window, make_policy,
                                      split_for_truncation)
from evalsuite.replay.free import FreeReplay
from evalsuite.replay.logged import LoggedReplay, check_replay_mode
from evalsuite.replay.stored import stored_contexts

__all__ = ["REPLAYS", "STOP", "TRUNCATE_LEFT", "ClosedReplay", "ContextPolicy", "FreeReplay", "LoggedReplay",
           "MethodReplay", "Render", "ReplaySetup", "TurnContext", "Window", "check_replay_mode", "make_policy",
           "replay_type", "split_for_truncation", "stored_contexts"]
