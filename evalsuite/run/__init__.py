"""The run: `evalsuite run` from a checked `RunConfig` to a stored run directory. Layered (pyproject.toml):

- `runner.py`: the orchestration (data, contention, engine, the turn loop, pairing, spans, the store, resume).
- `plan.py`: the plan printed before a run (what is left, and an estimate from costs measured on this machine).
- `resume.py`: the resume command of a run, and what may differ between a run and its resume.

The machine's load (`evalsuite.contention`) is below the engines, which record it too, so it is not in this package.
"""
