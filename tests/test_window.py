"""The sliding window of the draft-KV drafters (`window`, docs/methods.md §7), on tiny random drafters:

- a window at least as long as the whole decode gives exactly the drafts of no window;
- with a small window, the drafts equal a full-attention reference whose attention masks everything outside the
  window explicitly, with RoPE at absolute positions; tokens and features older than the window change nothing,
  one inside it changes the drafts;
- the cache then stops growing: the bytes held and allocated are bounded by W + SLACK rows while the context grows;
- `window` is validated and refused for the methods without a draft KV cache, a variant label runs beside its base
  in one run, and run.json and the records carry it.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from evalsuite.catalog import method_spec
from evalsuite.cli import app
from evalsuite.config import RunConfig
from evalsuite.errors import UserError
from evalsuite.methods.base import Sampling
from evalsuite.methods.eagle3 import Eagle3Method
from evalsuite.methods.window import SLACK
from evalsuite.target.model import TargetModel
from evalsuite.testing import build_tiny_target
from tests.helpers import PROMPT, decode, load_turns

K = 5
# (method, options): both EAGLE-3 formats, both DFlash layouts, DSpark
DRAFTERS = [("eagle3", {"format": "deepspec"}), ("eagle3", {"format": "specforge"}), ("dflash", {}),
            ("dflash", {"layout": "block7"}), ("dspark", {})]
IDS = [f"{m}-{o.get('format') or o.get('layout') or 'default'}" for m, o in DRAFTERS]


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory) -> TargetModel:
    """8 layers: deep enough for both EAGLE-3 layer rules (the block drafters fit it too)."""
    return TargetModel.load(str(build_tiny_target(tmp_path_factory.mktemp("window-target"), "qwen3", layers=8)))


def build(target, method: str, options: dict, window: int | None = None):
    options = dict(options, seed=3, drafter="random", **({"window": window} if window else {}))
    return method_spec(method).factory(target, options)


def features_for(drafter, target, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, target.vocab_size, (n + 1,), generator=g)
    return ids, torch.randn(n, len(drafter.feature_layers), target.hidden_size, generator=g)


def drafts(drafter, k: int = K):
    """Propose once; the proposal and the tensors its tokens were read from (EAGLE-3: the logits of every chain
    step; DFlash/DSpark: the block outputs)."""
    seen = []
    if isinstance(drafter, Eagle3Method):
        logits = drafter.model.logits
        drafter.model.logits = lambda hidden: seen.append(logits(hidden)) or seen[-1]
        try:
            proposal = drafter.propose(k, Sampling(), None)
        finally:
            del drafter.model.logits
    else:
        block = drafter.block_outputs
        drafter.block_outputs = lambda: seen.append(block()) or seen[-1]
        try:
            proposal = drafter.propose(k, Sampling(), None)
        finally:
            del drafter.block_outputs
    return proposal.tokens, torch.cat([t.reshape(-1) for t in seen])


def scripted(drafters, target, n: int, commits: list[int], perturb=None):
    """Start every drafter on the same synthetic context of n positions (perturb(ids, features) may change a
    drafter's copy: the i-th drafter gets perturb[i]), then alternate propose and commits of the given sizes.
    Returns, per drafter, the list of (tokens, read tensors) of every proposal."""
    ids, features = features_for(drafters[0], target, n + sum(commits))
    out = []
    for i, drafter in enumerate(drafters):
        mine_ids, mine_features = ids.clone(), features.clone()
        if perturb and perturb[i]:
            perturb[i](mine_ids, mine_features)
        drafter.start_turn(mine_ids[: n + 1], mine_features[:n])
        seen, at = [drafts(drafter)], n
        for m in commits:
            drafter.commit(mine_ids[at + 1: at + m + 1], mine_features[at: at + m])
            at += m
            seen.append(drafts(drafter))
        out.append(seen)
    return out


# ---- exactness --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method,options", DRAFTERS, ids=IDS)
def test_a_window_longer_than_the_decode_gives_the_same_drafts(deep_target, method, options):
    full, windowed = build(deep_target, method, options), build(deep_target, method, options, window=len(PROMPT) + 64)
    seen = {}
    for name, drafter in (("full", full), ("windowed", windowed)):
        proposals = []
        propose = drafter.propose
        drafter.propose = lambda *a, _p=propose, _l=proposals: _l.append(_p(*a)) or _l[-1]
        result = decode(deep_target, drafter, PROMPT, 40, k=K)
        del drafter.propose
        seen[name] = ([p.tokens.tolist() for p in proposals], result.output_ids,
                      [(s.num_drafted, s.num_accepted, s.draft_history_bytes) for s in result.steps])
    assert seen["full"] == seen["windowed"]
    assert windowed.describe()["window"] == len(PROMPT) + 64 and full.describe()["window"] is None


def explicit_window_mask(window: int, block: int | None):
    """scaled_dot_product_attention of a full-attention drafter, with everything outside the window masked
    explicitly (the cache holds every position from 0, so a key's index is its position). EAGLE-3 (block None):
    each query at position p sees keys p-window+1 … p; a block (anchor at T - block) sees the window's context
    keys before the anchor and the whole block."""
    original = F.scaled_dot_product_attention

    def attention(query, key, value, attn_mask=None, **kwargs):
        queries, keys = query.shape[-2], key.shape[-2]
        columns = torch.arange(keys)[None, :]
        if block is None:
            rows = torch.arange(keys - queries, keys)[:, None]
            allowed = (columns <= rows) & (columns > rows - window)
        else:
            anchor = keys - block
            allowed = (columns >= anchor - window).expand(queries, keys)
        if attn_mask is not None:
            allowed = allowed & attn_mask
        return original(query, key, value, attn_mask=allowed, **kwargs)

    return attention


@pytest.mark.parametrize("method,options", DRAFTERS, ids=IDS)
def test_small_window_equals_an_explicitly_masked_full_drafter(deep_target, monkeypatch, method, options):
    window, n, commits = 6, 30, [1, 3, 6, 2, 6, 1, 4]
    windowed, reference = build(deep_target, method, options, window), build(deep_target, method, options)
    [got] = scripted([windowed], deep_target, n, commits)
    block = None if isinstance(reference, Eagle3Method) else reference.block_size
    monkeypatch.setattr(F, "scaled_dot_product_attention", explicit_window_mask(window, block))
    [expected] = scripted([reference], deep_target, n, commits)
    monkeypatch.undo()
    for (tokens, read), (ref_tokens, ref_read) in zip(got, expected):
        torch.testing.assert_close(read, ref_read, rtol=1e-4, atol=1e-5)
        assert tokens.tolist() == ref_tokens.tolist()
    [unmasked] = scripted([build(deep_target, method, options)], deep_target, n, commits)
    assert not torch.allclose(got[0][1], unmasked[0][1])  # the window does change what the drafter reads


@pytest.mark.parametrize("method,options", DRAFTERS, ids=IDS)
def test_only_positions_inside_the_window_change_the_drafts(deep_target, method, options):
    window, n, commits = 8, 40, [3, 6, 1, 6]
    # EAGLE-3's newest entry n-1 reads entries n-window … n-1 (entry i: feature i with token i+1); a block reads
    # the context rows n-window … n-1. Everything older is outside every later window too.
    oldest = n - window

    def outside(ids, features):
        ids[:oldest + 1] = (ids[:oldest + 1] + 17) % 200 + 4
        features[:oldest] = torch.randn_like(features[:oldest])

    def inside(ids, features):
        features[oldest] += 1.0

    drafters = [build(deep_target, method, options, window) for _ in range(3)]
    same, changed_old, changed_new = scripted(drafters, deep_target, n, commits, [None, outside, inside])
    for (tokens, read), (old_tokens, old_read) in zip(same, changed_old):
        assert torch.equal(read, old_read) and torch.equal(tokens, old_tokens)
    assert not torch.allclose(same[0][1], changed_new[0][1])


@pytest.mark.parametrize("method,options", DRAFTERS[:1] + DRAFTERS[2:3], ids=IDS[:1] + IDS[2:3])
def test_rope_positions_stay_absolute(deep_target, method, options):
    """A window masks, it never renumbers: every row and query keeps its absolute RoPE position."""
    window, n = 8, 40
    drafter = build(deep_target, method, options, window)
    rotary = drafter.model.rotary if isinstance(drafter, Eagle3Method) else drafter.model.rotary_emb
    positions = []
    forward = rotary.forward
    rotary.forward = lambda x, ids: positions.append(ids.reshape(-1).tolist()) or forward(x, ids)
    try:
        scripted([drafter], deep_target, n, [3])
    finally:
        del rotary.forward
    if isinstance(drafter, Eagle3Method):
        # the draft prefill builds entries n-window … n-1 only; the chain continues at n, n+1, …; the commit
        # writes entries n … n+2
        assert positions[0] == list(range(n - window, n)) and positions[1] == [n]
        assert [n, n + 1, n + 2] in positions
    else:
        # the prefill builds rows n-window … n-1 only; the block sits at the anchor n … n+B-1; after the commit
        # the new rows n … n+2 and the block at n+3 …
        B = drafter.block_size
        assert positions[0] == list(range(n - window, n)) and positions[1] == list(range(n, n + B))
        assert positions[2] == list(range(n, n + 3 + B))


# ---- bounded state ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method,options", DRAFTERS, ids=IDS)
def test_state_stops_growing_past_the_window(deep_target, method, options):
    window, n = 16, 20
    commits = [1 + (i * 5) % (K + 1) for i in range(100)]  # about 350 positions, commits of 1 … K+1
    windowed, full = build(deep_target, method, options, window), build(deep_target, method, options)
    ids, features = features_for(windowed, deep_target, n + sum(commits))
    history, allocated, full_history, contexts = [], [], [], []
    for drafter in (windowed, full):
        drafter.start_turn(ids[: n + 1], features[:n])
    at = n
    for m in commits:
        for drafter in (windowed, full):
            drafter.propose(K, Sampling(), None)
            drafter.commit(ids[at + 1: at + m + 1], features[at: at + m])
            if not isinstance(drafter, Eagle3Method):
                drafter.block_outputs()  # absorb the commit's rows into the cache
        at += m
        contexts.append(at)
        history.append(windowed.state_bytes().history)
        allocated.append(windowed.cache.allocated_bytes())
        full_history.append(full.state_bytes().history)
    row = windowed.cache.nbytes_per_row()
    assert contexts[-1] > 3 * (window + SLACK)
    assert max(history) <= (window + SLACK) * row and min(history[len(history) // 2:]) >= window * row
    past = [a for a, c in zip(allocated, contexts) if c > 2 * (window + SLACK)]
    assert max(allocated) <= (window + SLACK) * row and len(set(past)) == 1  # allocated once, never grown again
    assert full_history[-1] == contexts[-1] * row  # without a window: every position
    assert windowed.cache.held <= window + SLACK and windowed.cache.base > 0


def test_a_new_turn_keeps_only_the_window_it_can_reuse(deep_target):
    """Prefix reuse under a window: a turn that extends the last one keeps its held rows; one that shares less
    than the window restarts at the window's oldest row; both give the drafts of a fresh drafter."""
    window = 8
    drafter = build(deep_target, "dflash", {}, window)
    ids, features = features_for(drafter, deep_target, 120)
    # extends within the window (keeps rows), extends past it, shares a prefix shorter than the context
    for n in (40, 44, 100, 60):
        fresh = build(deep_target, "dflash", {}, window)
        drafter.start_turn(ids[: n + 1], features[:n])
        fresh.start_turn(ids[: n + 1], features[:n])
        torch.testing.assert_close(drafter.block_outputs(), fresh.block_outputs(), rtol=1e-5, atol=1e-6)
        assert drafter.cache.length == n and drafter.cache.held <= window + SLACK


# ---- options, labels, records -----------------------------------------------------------------------------------
@pytest.mark.parametrize("options,message", [
    ({"eagle3": {"window": "0"}}, "eagle3.window=0: must be >= 1"),
    ({"eagle3": {"window": "2k"}}, "eagle3.window=2k: not a valid int"),
    ({"dlite": {"window": "64"}}, "dlite keeps no draft KV cache over the context, so it has no window; "
                                  "windowable: dflash, dspark, eagle3"),
    ({"ngram": {"window": "64"}}, "ngram keeps no draft KV cache"),
])
def test_bad_window_is_a_one_line_error(options, message):
    config = RunConfig(methods=["eagle3", "dlite", "ngram"], task="gsm8k", method_options=options)
    with pytest.raises(UserError, match=re.escape(message)) as err:
        config.validate()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("methods,message", [
    (["eagle3:window=0"], "--method eagle3:window=0: must be >= 1"),
    (["eagle3:"], "write METHOD:KEY=VALUE"),
    (["dlite:window=8"], "dlite keeps no draft KV cache"),
    (["eagle3:window=8", "eagle3:window=8"], "given more than once"),
    (["eagel3:window=8"], "unknown method 'eagel3' (did you mean eagle3?)"),
])
def test_bad_label_is_a_one_line_error(methods, message):
    with pytest.raises(UserError, match=re.escape(message)) as err:
        RunConfig(methods=methods, task="gsm8k").validate()
    assert "\n" not in str(err.value)


def test_a_variant_takes_its_base_settings_and_drafter():
    config = RunConfig(methods=["eagle3", "eagle3:window=2048"], task="gsm8k", drafters={"eagle3": "random"},
                       method_options={"eagle3": {"seed": "4"}, "eagle3:window=2048": {"format": "specforge"}})
    config.validate()
    assert config.method_options == {"eagle3": {"seed": 4},
                                     "eagle3:window=2048": {"window": 2048, "seed": 4, "format": "specforge"}}
    assert config.drafters == {"eagle3": "random", "eagle3:window=2048": "random"}
    with pytest.raises(UserError, match="already sets window=2048"):
        RunConfig(methods=["eagle3:window=2048"], task="gsm8k",
                  method_options={"eagle3:window=2048": {"window": "8"}}).validate()


def test_window_is_refused_where_it_is_not_measured():
    with pytest.raises(UserError, match="--engine vllm: method 'eagle3:window=8' with a label or a window"):
        RunConfig(methods=["eagle3:window=8"], task="gsm8k", engine="vllm").validate()
    from evalsuite.profile.sweep import profile_options

    with pytest.raises(UserError, match="a draft window is not profiled"):
        profile_options("eagle3:window=8", {})
    with pytest.raises(UserError, match="a draft window is not profiled"):
        profile_options("dflash", {"dflash": {"window": "8"}})
    assert profile_options("eagle3:format=specforge", {"eagle3": {"seed": "2"}}) == {"format": "specforge", "seed": 2}


def test_a_run_holds_a_method_and_its_windowed_variant(tiny_qwen3_dir, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "run", "--method", "ar,dflash,dflash:window=8", "--drafter", "dflash=random", "--task", "mt-bench",
        "--target", str(tiny_qwen3_dir), "--limit", "1", "--max-new-tokens", "24", "--k", "4", "--out", str(out)],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "run.json").read_text())
    assert config["methods"] == ["ar", "dflash", "dflash:window=8"]
    assert config["method_options"]["dflash:window=8"] == {"window": 8}
    assert config["drafters"]["dflash:window=8"]["window"] == 8 and config["drafters"]["dflash"]["window"] is None
    turns = load_turns(out)
    assert set(turns.method) == {"ar", "dflash", "dflash:window=8"}
    outputs = {m: rows.sort_values(["sample_id", "turn"]).output_ids.map(list).tolist()
               for m, rows in turns.groupby("method")}
    assert outputs["dflash:window=8"] == outputs["ar"] == outputs["dflash"]  # lossless at T=0
