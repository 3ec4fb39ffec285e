"""`evalsuite profile`: cost surfaces with random weights. Layered (pyproject.toml):

- `sweep.py`: the timed sweep and the command (`run_profile`): the target at every (batch, context, block), each
  drafter at every (batch, context), each point's memory estimated first; the tables and run.json.
- `shapes.py`: the shape catalogue (`SHAPES`) and a random-weight target of a shape, a config.json or a model
  directory's config; the real text the drafters look up in.
- `memory.py`: the memory model (a target point's and a drafter point's bytes, the weights', the budget).
- `batched.py`: drafting for B streams at once, the learned methods' own modules over a batch axis (the engine
  drafts one stream, so only the profile uses them).
"""
