"""The store and its records, with no torch (pyproject.toml's contracts):

- `run_store.py`: the append-only store of a run (`RunStore.write_turn`, one part per table per turn), its one
  reader (`read_run`, `read_table`) and `compact`.
- `records.py`: the typed data, `Step` and `TurnResult` (what an engine measured) and `StepRecord` and `TurnRecord`
  (the stored rows), each row built once from a result.
"""
