"""The benchmarks' timing helpers on CPU: warm-up calls are not timed, setup runs before every call."""

from __future__ import annotations

import time

import torch

from tritontts.bench.offline_timing import median_ms, timed


def test_median_ms_skips_warm_up_and_runs_setup_before_each_call():
    calls, setups = [], []

    def call():
        calls.append(len(calls))
        time.sleep(0.05 if len(calls) <= 2 else 0.001)  # the slow first calls are the warm-ups

    ms = median_ms(call, reps=3, device=torch.device("cpu"), warmup=2, setup=lambda: setups.append(1))
    assert len(calls) == 5 and len(setups) == 5
    assert ms < 40


def test_timed_returns_the_result_and_seconds():
    out, seconds = timed(torch.device("cpu"), lambda x: x + 1, 1)
    assert out == 2 and seconds >= 0
