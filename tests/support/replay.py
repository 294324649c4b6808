"""Simulated traffic, its batch replay, and the service's gauges compared with the replay."""

from __future__ import annotations

import math
from typing import Any

import pytest

from stream_ndcg.config import Settings
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay
from tests.support.service import Samples

CUTOFFS = (5, 10)
# The simulator's variants, A and B: each gets its own quality gauges.
VARIANTS = len(SimulationSpec().variants)
# What expect_equal_to_replay compares for each variant and cut-off: nDCG, DCG and the judged ratio.
GAUGES_PER_CUTOFF = 3


def simulated(events: int, seed: int, malformed: float = 0.01) -> list[tuple[bytes, bytes]]:
    """Keyed messages of simulated traffic, 1% of them malformed by default, some judgments up to 10 minutes late."""
    spec = SimulationSpec(events=events, seed=seed, queries=300, rate=200.0, malformed_share=malformed,
                          max_delay_ms=600_000)
    return list(Simulator(spec).messages())


def replay_of(messages: list[tuple[bytes, bytes]], cutoffs: tuple[int, ...] = CUTOFFS) -> dict[str, Any]:
    """The batch replay's summary of the messages' values, with the service's default dedup horizon."""
    replay = Replay(Measure(cutoffs=cutoffs), dedup_horizon_ms=Settings().dedup_horizon)
    for _, value in messages:
        replay.add(value)
    return replay.summary()


def compared_gauges(cutoffs: tuple[int, ...] = CUTOFFS) -> int:
    """How many gauges expect_equal_to_replay compares for simulated traffic."""
    return VARIANTS * len(cutoffs) * GAUGES_PER_CUTOFF


def expect_equal_to_replay(samples: Samples, summary: dict[str, Any], window: str, cutoffs: tuple[int, ...]) -> int:
    """Every quality gauge of one window against the replay's numbers, to 1e-9; returns how many were compared
    (nDCG, DCG and judged ratio of each variant and cut-off), for the caller to check against what its
    traffic holds (`compared_gauges`). Fails if the replay has no variant, so nothing would be compared."""
    compared = 0
    for variant, by_k in summary["by_segment"].get("variant", {}).items():
        for k in cutoffs:
            expected = by_k[str(k)]
            labels = {"k": str(k), "window": window, "variant": variant}
            key = tuple(sorted(labels.items()))
            assert samples[("stream_ndcg_scored_impressions", key)] == expected["scored_impressions"]
            pairs = [("stream_ndcg_ndcg", expected["ndcg_mean"]), ("stream_ndcg_dcg", expected["dcg_mean"]),
                     ("stream_ndcg_judged_ratio", expected["judged_ratio"])]
            for name, value in pairs:
                got = samples[(name, key)]
                if value is None:
                    assert math.isnan(got), (name, key)
                else:
                    assert got == pytest.approx(value, abs=1e-9), (name, key, got, value)
                compared += 1
            impressions_key = tuple(sorted({"window": window, "variant": variant}.items()))
            assert samples[("stream_ndcg_impressions", impressions_key)] == expected["impressions"]
    assert compared, "the replay has no variant: nothing to compare"
    return compared


def assert_close_figures(served: object, expected: object, where: str = "") -> None:
    """The API's figures and the replay's: equal, floats to 1e-9."""
    if isinstance(expected, dict):
        assert isinstance(served, dict) and served.keys() == expected.keys(), where
        for key, value in expected.items():
            assert_close_figures(served[key], value, f"{where}/{key}")
    elif isinstance(expected, float) and isinstance(served, float | int):
        assert served == pytest.approx(expected, abs=1e-9), where
    else:
        assert served == expected, where
