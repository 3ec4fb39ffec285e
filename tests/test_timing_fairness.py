"""Timing fairness in the runner (no timed assertions): a seed-shuffled, recorded order of methods per turn,
--repeats with identical outputs and the median kept, warm-up of every verify block size, the device clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from evalsuite.config import RunConfig
from evalsuite.errors import UserError
from evalsuite.store.records import Step, TurnResult
from tests.helpers import load_steps, load_turns
from evalsuite.engines.hf import median_repeat
from evalsuite.run.runner import Runner
from evalsuite.timing import DeviceClock, wall


def six_turns(tmp_path: Path) -> Path:
    messages = []
    for i in range(6):
        messages += [{"role": "user", "content": f"Count to {i + 3}."}, {"role": "assistant", "content": "1 2 3"}]
    path = tmp_path / "six.jsonl"
    path.write_text(json.dumps({"id": "six", "messages": messages}) + "\n")
    return path


def run(target_dir: Path, out: Path, data: Path, **overrides) -> Runner:
    options = dict(methods=["ngram", "ar"], task="custom", target=str(target_dir), data_path=str(data),
                   max_new_tokens=12, k=3, warmup=False)
    options.update(overrides)
    runner = Runner(RunConfig(**options), out)
    runner.load()
    runner.run()
    return runner


def test_the_order_of_methods_is_shuffled_per_turn_and_recorded(tiny_llama_dir, tmp_path):
    data = six_turns(tmp_path)
    runner = run(tiny_llama_dir, tmp_path / "a", data)
    turns = load_turns(tmp_path / "a")
    for turn, group in turns.groupby("turn"):
        assert sorted(group.position) == [0, 1]  # a permutation of the methods at every turn
        order = list(group.sort_values("position").method)
        assert order == runner.turn_order("six", turn)
    first = turns[turns.position == 0].sort_values("turn").method
    assert set(first) == {"ar", "ngram"}  # ar does not always go first
    again = load_turns(run(tiny_llama_dir, tmp_path / "b", data).store.root)
    assert again.sort_values(["method", "turn"]).position.tolist() == \
        turns.sort_values(["method", "turn"]).position.tolist()  # the seed fixes the order
    other_seed = Runner(RunConfig(methods=["ngram", "ar"], task="custom", seed=1), tmp_path / "c")
    assert [other_seed.turn_order("six", t) for t in range(6)] != [runner.turn_order("six", t) for t in range(6)]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_repeats_decode_the_same_and_record_n(tiny_llama_dir, tmp_path, temperature):
    data = six_turns(tmp_path)
    once = run(tiny_llama_dir, tmp_path / "once", data, temperature=temperature, max_turns=3)
    thrice = run(tiny_llama_dir, tmp_path / "thrice", data, temperature=temperature, max_turns=3, repeats=3)
    assert json.loads((thrice.store.root / "run.json").read_text())["repeats"] == 3
    a, b = (load_turns(r.store.root).sort_values(["method", "turn"]) for r in (once, thrice))
    assert [list(x) for x in a.output_ids] == [list(x) for x in b.output_ids]  # same seed, same choices
    steps_a, steps_b = (load_steps(r.store.root).sort_values(["method", "turn", "step"]) for r in (once, thrice))
    assert steps_a.num_accepted.tolist() == steps_b.num_accepted.tolist()
    # every repeat's decode seconds are recorded (the report's timing noise); one decode records none
    assert all(len(r) == 3 and min(r) > 0 for r in b[b.stop_reason != "skipped"].repeat_decode_s)
    assert all(len(r) == 0 for r in a.repeat_decode_s)


def result(loop_s: float, draft_prefill_s: float, output=(5, 6), accepted=(1,)) -> TurnResult:
    steps = [Step(0, 2, a, a + 1, 0.0, 0.0, loop_s, 0, 0) for a in accepted]
    return TurnResult(list(output), steps, draft_prefill_s=draft_prefill_s, decode_s=draft_prefill_s + loop_s)


def test_median_repeat_keeps_the_median_loop_and_the_first_start_of_turn_work():
    results = [result(3.0, 0.5), result(1.0, 0.01), result(2.0, 0.01)]
    kept = median_repeat(results, "x")
    assert kept is results[2]
    assert kept.draft_prefill_s == 0.5 and kept.decode_s == pytest.approx(2.5)
    assert kept.repeat_decode_s == pytest.approx([3.5, 1.5, 2.5])  # each on the first repeat's start-of-turn work
    pair = [result(3.0, 0.5), result(1.0, 0.01)]
    assert median_repeat(pair, "x") is pair[1]  # the lower middle: a measured repeat, not an average
    with pytest.raises(UserError, match="--repeats 2: x: a repeat decoded differently"):
        median_repeat([result(1.0, 0.1), result(1.0, 0.1, output=(5, 7))], "x")
    with pytest.raises(UserError, match="use --repeats 1"):
        median_repeat([result(1.0, 0.1), result(1.0, 0.1, accepted=(0,))], "x")


def test_a_method_that_learns_across_turns_forgets_a_repeated_turn(tiny_llama_dir, tmp_path):
    """suffix's global tree learns every reply: before a repeat its trees are rebuilt as they were when the turn
    started, so every repeat does the same work (median_repeat would refuse otherwise) and later turns see the trees
    a single decode leaves."""
    pytest.importorskip("arctic_inference")
    data = six_turns(tmp_path)
    once = run(tiny_llama_dir, tmp_path / "once", data, methods=["suffix", "ar"], max_turns=4)
    thrice = run(tiny_llama_dir, tmp_path / "thrice", data, methods=["suffix", "ar"], max_turns=4, repeats=3)
    a, b = (load_turns(r.store.root).sort_values(["method", "turn"]) for r in (once, thrice))
    assert [list(x) for x in a.output_ids] == [list(x) for x in b.output_ids]
    steps_a, steps_b = (load_steps(r.store.root).sort_values(["method", "turn", "step"]) for r in (once, thrice))
    assert steps_a.num_drafted.tolist() == steps_b.num_drafted.tolist()  # the same drafts: the same tree
    assert steps_b.draft_state_bytes.tolist() == steps_a.draft_state_bytes.tolist()  # the very same trees


def test_bad_repeats_is_a_clear_error():
    with pytest.raises(UserError, match="--repeats 0: must be between 1 and 100"):
        RunConfig(methods=["ar"], task="gsm8k", repeats=0).validate()


def test_warm_up_runs_every_verify_block_size(tiny_llama_dir, tmp_path):
    runner = Runner(RunConfig(methods=["ngram", "ar"], task="custom", target=str(tiny_llama_dir),
                              data_path=str(six_turns(tmp_path)), k=5), tmp_path / "w")
    runner.load()
    sizes = []
    forward = runner.engine.target.forward

    def spy(input_ids, cache, layer_ids=(), last_only=False):
        if not last_only:  # a prefill returns only its last logits; verify blocks return all
            sizes.append(input_ids.numel())
        return forward(input_ids, cache, layer_ids, last_only)

    runner.engine.target.forward = spy
    runner.warm_up()
    assert set(range(1, 5 + 2)) <= set(sizes)


def test_the_cpu_clock_reads_wall_time_between_marks():
    clock = DeviceClock(torch.device("cpu"))
    start = clock.mark()
    stop = clock.mark()
    assert isinstance(start, float) and clock.seconds(start, stop) >= 0.0


def test_the_clock_times_one_call_and_returns_its_result():
    seconds, result = DeviceClock(torch.device("cpu")).time(lambda: sum(range(1000)))
    assert result == 499500 and seconds >= 0.0
    start = wall()
    assert wall() - start >= 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_clock_uses_events():
    clock = DeviceClock(torch.device("cuda"))
    start = clock.mark()
    torch.ones(1024, 1024, device="cuda").matmul(torch.ones(1024, 1024, device="cuda"))
    stop = clock.mark()
    assert isinstance(start, torch.cuda.Event) and clock.seconds(start, stop) > 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_clock_times_one_call_with_events():
    ones = torch.ones(1024, 1024, device="cuda")
    seconds, product = DeviceClock(torch.device("cuda")).time(lambda: ones.matmul(ones))
    assert seconds > 0.0 and float(product[0, 0]) == 1024.0
