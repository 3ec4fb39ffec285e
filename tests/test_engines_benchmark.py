"""benchmarks/engines.py (our engine beside the peers) on a tiny target: every row printed, a peer that is missing
or has nothing to load skipped with its reason named, our ar and transformers' generate writing the same tokens."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import engines  # noqa: E402


def test_the_peers_table_on_a_tiny_target(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "rows.json"
    try:
        code = engines.main(["--target", str(tiny_llama_dir), "--contexts", "48,96", "--new-tokens", "6",
                             "--repeats", "1", "--peers", "ours,ours-compile,hf-generate,llama-cpp", "--json", str(out)])
    finally:
        torch.set_num_threads(1)
    printed = capsys.readouterr().out
    assert code == 0, printed
    rows = json.loads(out.read_text())
    engines_seen = {(r["engine"], r["context"]) for r in rows["rows"]}
    for context in (48, 96):
        for name in ("ours ar", "ours ngram", "ours verify-8", "ours weight products", "hf-generate (static cache)",
                     "ours --compile ar", "ours --compile ngram", "ours --compile verify-8"):
            assert (name, context) in engines_seen
    assert all(r["ms"] > 0 for r in rows["rows"])
    # the compiled decode writes the same greedy tokens as the eager one
    assert "ours ar and ours --compile ar write the same tokens at contexts [48, 96] of [48, 96]" in printed
    # llama.cpp either is not installed or has no GGUF for a local directory: named, not dropped
    assert any(s.startswith("llama-cpp: ") for s in rows["skipped"]) and "skipped llama-cpp: " in printed
    assert "ours ar and hf-generate write the same greedy tokens (up to 16) at contexts [48, 96] of [48, 96]" in printed


def test_an_unknown_peer_is_a_one_line_error(capsys):
    assert engines.main(["--peers", "ours,tensorrt"]) == 2
    assert capsys.readouterr().err.strip() == "error: --peers tensorrt: choose from ours, ours-compile, hf-generate, llama-cpp, vllm"


def test_a_decode_difference_divides_by_the_tokens_written(monkeypatch):
    """A peer that stops at EOS after 30 of 64 asked tokens: per-token time over the 29 extra tokens it wrote, not
    over 63 (the old reading, which made llama.cpp look twice as fast as it is)."""
    clock = [0.0]
    monkeypatch.setattr(engines.time, "perf_counter", lambda: clock[0])

    def run(n):  # 0.1 s of prefill, then 10 ms per token, up to an EOS after 30 tokens
        wrote = min(n, 30)
        clock[0] += 0.1 + 0.01 * wrote
        return wrote
    assert abs(engines.decode_difference(run, 64) - 10.0) < 1e-9

    def silent(n):
        clock[0] += 0.1
        return 1
    with pytest.raises(RuntimeError, match="asked for 64 tokens, wrote 1: nothing to time"):
        engines.decode_difference(silent, 64)
