"""The sums of squares: the engine's, kept through late judgments and any batch boundaries, equal
a batch recomputation from the replay's per-impression values."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_ndcg.engine import Engine
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.vocabulary import MOMENTS, dcg_squares_at, full_segment_key, ndcg_squares_at
from stream_ndcg.windows import field_sums
from tests.support.batches import apply_batch, parsed
from tests.unit.test_properties import event_streams, in_batches, measures


def recomputed(per_impression: list[dict[str, Any]], cutoffs: tuple[int, ...]) -> dict[str, dict[str, float]]:
    """Per segment key: the sums of squares of each impression's DCG@k and defined nDCG@k."""
    by_segment: dict[str, list[dict[str, Any]]] = {}
    for row in per_impression:
        by_segment.setdefault(full_segment_key(tuple(row["segment"].items())), []).append(row)
    sums: dict[str, dict[str, float]] = {}
    for segment, rows in by_segment.items():
        sums[segment] = {MOMENTS: float(len(rows))}
        for k in map(str, cutoffs):
            sums[segment][dcg_squares_at(int(k))] = math.fsum(row["dcg"][k] ** 2 for row in rows)
            sums[segment][ndcg_squares_at(int(k))] = math.fsum(
                row["ndcg"][k] ** 2 for row in rows if row["ndcg"][k] is not None)
    return sums


@given(event_streams(), measures, st.lists(st.integers(1, 6), min_size=40, max_size=40))
def test_the_sums_of_squares_equal_the_replays_per_impression_values_after_every_batch(
        messages: list[bytes], measure: Measure, batch_sizes: list[int]) -> None:
    engine = Engine(measure)
    store = MemoryStore()
    epoch = store.claim("t:0")
    replay = Replay(measure)
    for batch, position in in_batches(messages, batch_sizes):
        apply_batch(store, engine, "t:0", parsed(batch), epoch=epoch, next_offset=position)
        for message in batch:
            replay.add(message)
        expected = recomputed(list(replay.per_impression()), measure.cutoffs)
        aggregates = store.aggregates()
        for segment in {key[1] for key in aggregates} | expected.keys():
            ours = field_sums({key: value for key, value in aggregates.items() if key[1] == segment})
            for name, value in expected.get(segment, {}).items():
                assert ours.get(name, 0.0) == pytest.approx(value, rel=1e-9, abs=1e-9), (segment, name)
