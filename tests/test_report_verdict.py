"""The verdict sentence and the caveat box are generated from the frames and the run.json / training-report dicts."""

from __future__ import annotations

import pandas as pd

from evalsuite.report import verdict

NAN = float("nan")


def frames_for(task="swebench", slope=(0.0, -0.1, 0.1)):
    speed = pd.DataFrame([
        {"task": task, "method": "suffix", "n_trajectories": 5, "n_turns": 36, "speedup": 1.96, "speedup_lo": 1.78,
         "speedup_hi": 2.16, "verdict": "faster than ar"},
        {"task": task, "method": "dlite", "n_trajectories": 5, "n_turns": 36, "speedup": 0.99, "speedup_lo": 0.94,
         "speedup_hi": 1.04, "verdict": "not separable from ar"},
        {"task": task, "method": "dflash", "n_trajectories": 5, "n_turns": 36, "speedup": 0.76, "speedup_lo": 0.74,
         "speedup_hi": 0.78, "verdict": "slower than ar"}])
    overall = pd.DataFrame([{"task": task, "method": m, "tau": t, "tau_break_even": s}
                            for m, t, s in (("suffix", 2.81, 1.45), ("dlite", 1.76, 1.79), ("dflash", 1.45, 1.9))])
    effect = pd.DataFrame([{"task": task, "method": m, "n_trajectories": 5, "slope_log_speedup": slope[0],
                            "slope_lo": slope[1], "slope_hi": slope[2], "context_min": 1528, "context_max": 7518}
                           for m in ("suffix", "dlite", "dflash")])
    return speed, overall, effect


def test_verdict_sentence_from_the_frames():
    label, sentence = verdict.verdict("swebench", *frames_for())
    assert label == "pays off"
    assert sentence.startswith("swebench (5 trajectories, 36 turns, contexts 1,528–7,518 tokens): speculative "
                               "decoding pays off (decode-only speedup) with suffix 1.96× [1.78, 2.16], τ 2.81 vs break-even 1.45")
    assert "it does not with dflash 0.76× [0.74, 0.78], τ 1.45 vs break-even 1.90" in sentence
    assert "dlite 0.99× [0.94, 1.04], τ 1.76 vs break-even 1.79 cannot be told apart from `ar`" in sentence
    assert "no method's speedup changes measurably with context" in sentence and "±" not in sentence


def test_verdict_says_when_it_changes_with_context_and_when_it_cannot_tell():
    label, sentence = verdict.verdict("swebench", *frames_for(slope=(0.3, 0.1, 0.5)))
    assert label == "pays off; changes with context"
    assert "suffix's speedup rises 23% per doubling of the context [+7%, +41%]" in sentence
    # a slope fitted over trajectories that grew 1.2x is read over 1.2x, not extrapolated to a doubling
    speed, overall, effect = frames_for(slope=(1.0, 0.5, 1.5))
    label, sentence = verdict.verdict("swebench", speed, overall, effect.assign(context_span=1.2))
    assert "rises 20% from a trajectory's first to its last turn (its context grows only ×1.20 there" in sentence
    label, sentence = verdict.verdict("swebench", speed, overall, effect.assign(context_span=1.5))
    assert "rises 50% over its trajectories' typical context growth (×1.50) [+22%, +84%]" in sentence
    speed, overall, effect = frames_for(task="gsm8k", slope=(NAN, NAN, NAN))
    speed = speed[speed.method != "suffix"]
    label, sentence = verdict.verdict("gsm8k", speed, overall, effect)
    assert label == "not separable from ar"
    assert "no within-trajectory context effect to estimate" in sentence
    table = verdict.verdicts(*frames_for())
    assert list(table.columns) == verdict.VERDICT_COLUMNS and len(table) == 1


def test_caveat_box_from_run_json_and_training_reports():
    config = {"target_name": "SmolLM2-135M", "target_sha256": "d99538b711f0fa20", "dtype": "float32",
              "environment": {"device_name": "cpu: x86_64, 2 threads", "cuda": None}, "target_max_context": 8192,
              "context_policy": "stop", "task": "swebench", "max_new_tokens": 64, "k": 7, "temperature": 0.0,
              "repeats": 1, "sample_ids": ["a", "b", "c", "d", "e"], "max_turns": 8, "replay": "logged",
              "replay_source": "logged replies of google/gemini-3-pro-preview (mini-swe-agent)",
              "weight_layout": "column-major+onednn"}
    report = {"method": "dlite", "steps": 2800, "training_seconds": 1271.7, "torch_threads": 1,
              "data": {"reply_tokens": 68862, "heldout": {"rule": "drop a 13-gram overlap",
                                                          "samples_per_task": {"swebench": 30, "gsm8k": 1319}}},
              "init": {"from": "dlite"}, "data_sources": ["sharegpt:0.5"]}
    gsm8k = {**config, "task": "gsm8k", "max_new_tokens": 128, "sample_ids": None, "limit": 10, "max_turns": None,
             "replay": "free", "replay_source": None}
    lines = verdict.caveat_box([config, gsm8k], {"dlite": verdict.card_facts(report), "eagle3": None},
                               {"swebench": (5, 36), "gsm8k": (10, 10)}, ["swebench", "gsm8k"])
    text = "\n".join(lines)
    assert "Target: SmolLM2-135M (sha256 d99538b711f0…, float32)." in text
    assert "Hardware: cpu: x86_64, 2 threads, weights column-major+onednn." in text
    resumed = {**config, "environment": {"device_name": "cpu: AMD EPYC, 2 threads"},
               "resumes": [{"environment": {"device_name": "cpu: AMD EPYC, 2 threads"}},
                           {"environment": {"device_name": "cpu: Intel Xeon, 2 threads"}}]}
    assert ("Hardware: cpu: AMD EPYC, 2 threads, then cpu: Intel Xeon, 2 threads (resumed on another machine: each "
            "turn is paired with `ar` on the machine that decoded it), weights column-major+onednn.") in \
        "\n".join(verdict.caveat_box([resumed], {}, {"swebench": (5, 36)}, ["swebench"]))
    assert "Window: 8,192 tokens (context policy stop); new tokens per turn: swebench 64, gsm8k 128; K = 7" in text
    assert "timing repeats 1" in text
    assert ("Sample size and replay: swebench 5 samples (5 trajectories, 36 turns decoded per method), logged replay: "
            "logged replies of google/gemini-3-pro-preview (mini-swe-agent); gsm8k 10 samples (10 trajectories, 10 "
            "turns decoded per method), single-turn (no earlier replies in any context).") in text
    assert "dlite 2,800 steps, 21 min on 1 CPU thread, 68,862 reply tokens (warm-started" in text
    assert "eagle3: no training report" in text
    assert ("Held out: the training data of dlite excluded every sample of swebench, gsm8k (rule: drop a 13-gram "
            "overlap); not stated for eagle3.") in text


def test_caveat_box_labels_a_temperature_block_as_the_tables_do():
    """A T=1 run of a task is its own column (`mt-bench T=1`): its sample size is its own, and the drafters'
    held-out statement for the task covers it."""
    base = {"target_name": "SmolLM2-135M", "target_sha256": "d99538b711f0fa20", "dtype": "float32",
            "target_max_context": 8192, "context_policy": "stop", "task": "mt-bench", "max_new_tokens": 64, "k": 7,
            "temperature": 0.0, "limit": 5, "replay": "free"}
    hot = {**base, "temperature": 1.0, "limit": 3}
    report = {"method": "dlite", "steps": 10, "training_seconds": 60.0, "torch_threads": 1,
              "data": {"reply_tokens": 100, "heldout": {"rule": "drop a 13-gram overlap",
                                                        "samples_per_task": {"mt-bench": 80}}}}
    lines = verdict.caveat_box([base, hot], {"dlite": verdict.card_facts(report)},
                               {"mt-bench": (5, 10), "mt-bench T=1": (3, 6)}, ["mt-bench", "mt-bench T=1"])
    text = "\n".join(lines)
    assert "mt-bench 5 samples (5 trajectories, 10 turns decoded per method)" in text
    assert "mt-bench T=1 3 samples (3 trajectories, 6 turns decoded per method)" in text
    assert "Held out: the training data of dlite excluded every sample of mt-bench (rule: drop a 13-gram overlap)." \
        in text


def test_replay_source_falls_back_to_the_mode_and_the_task_source():
    assert verdict.replay_source({"replay": "logged", "task_source": "gemini logs"}) == \
        "logged replies from the task data (gemini logs)"
    assert verdict.replay_source({"replay": "free"}) == "each method's own earlier replies"
    assert verdict.replay_source({"replay": "logged", "replay_source": "logged replies of X"}) == "logged replies of X"


def test_a_speedup_within_the_measured_timing_noise_is_a_tie_with_ar():
    """suffix's 1.96× is 96 % from 1, dflash's 0.76× 24 %: with a measured noise of 30 % per method
    (√2·30 % ≈ 42 % combined with `ar`'s), dflash ties with `ar` and suffix still pays off; unmeasured noise
    changes nothing."""
    speed, overall, effect = frames_for()
    noise = pd.DataFrame([{"task": "swebench", "method": m, "median_cv": 0.30}
                          for m in ("ar", "suffix", "dlite", "dflash")])
    label, sentence = verdict.verdict("swebench", speed, overall, effect, noise=noise)
    assert label.startswith("pays off")
    assert "dflash" in sentence.split("within the timing noise of `ar`")[0].rsplit(";", 1)[-1]
    assert "a tie" in sentence and "does not with" not in sentence
    unmeasured = noise.assign(median_cv=NAN)
    assert verdict.verdict("swebench", speed, overall, effect, noise=unmeasured) == \
        verdict.verdict("swebench", speed, overall, effect)
    only_slow = speed[speed.method == "dflash"]
    label, _ = verdict.verdict("swebench", only_slow, overall, effect, noise=noise)
    assert label.startswith("ties with ar")
