"""The sums of squares: the engine's, kept through late judgments and any batch boundaries, equal
a batch recomputation from the replay's per-impression values; and what `/metrics` exports of them
and of the errors of a mean equals the same recomputation."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stream_ndcg.engine import Engine
from stream_ndcg.exporter import Exporter
from stream_ndcg.metric import Ideal, Measure
from stream_ndcg.offline.replay import Replay
from stream_ndcg.query_figures import PeriodicQueryFigures
from stream_ndcg.query_state import QueryState
from stream_ndcg.setting_values import format_duration
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.vocabulary import MOMENTS, AggregateKey, dcg_squares_at, full_segment_key, ndcg_squares_at
from stream_ndcg.windows import field_sums
from tests.support.batches import apply_batch, parsed
from tests.unit.test_drilldown import BUCKET, WINDOWS, Fed, expected_summary, messages, replay_of, window_of
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


@pytest.mark.parametrize("ideal", ["pool", "list"])
def test_the_exported_squares_and_errors_equal_a_recomputation_from_the_replay(ideal: Ideal) -> None:
    measure = Measure(cutoffs=(5, 10), ideal=ideal)
    stream = messages()
    fed = Fed(measure)
    registry = CollectorRegistry()
    exporter = Exporter(registry, fed.store, fed.view)
    # A clock that stands still: the interval never runs out, and only `refresh` (the service's
    # refresher thread) brings the figures over queries up to date before a scrape serves them.
    still = lambda: 0.0  # noqa: E731
    over_queries = PeriodicQueryFigures(fed.explorer.query_figures, lambda: fed.view.now_ms(fed.store, still),
                                        60.0, still)
    exporter.export_query_figures(over_queries)
    compared = 0
    # Judgments up to 4 minutes late: each check re-credits impressions already exported.
    for end in range(1000, len(stream) + 1, 1000):
        fed.feed(stream[end - 1000:end])
        over_queries.refresh()
        replay = replay_of(measure, stream[:end])
        samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                   for family in text_string_to_metric_families(generate_latest(registry).decode())
                   for sample in family.samples}
        for window_ms in WINDOWS:
            window = format_duration(window_ms)
            first, last = window_of(replay, window_ms)
            scored = [item for item in replay.scored() if first <= item.impression.ts // BUCKET <= last]
            expected = expected_summary(replay, window_ms, measure)
            for (variant,), by_k in expected.items():
                mine = [item.score for item in scored
                        if dict(item.impression.segment).get("variant", "none") == variant]
                labels = {"pipeline": "", "window": window, "variant": variant}
                assert samples[("stream_ndcg_squared_impressions", tuple(sorted(labels.items())))] == len(mine)
                for k, figures in by_k.items():
                    key = tuple(sorted({**labels, "k": k}.items()))
                    ndcgs = [s.ndcg[int(k)] for s in mine if s.ndcg[int(k)] is not None]
                    recomputed = {
                        "ndcg_squares": math.fsum(v * v for v in ndcgs if v is not None),
                        "dcg_squares": math.fsum(s.dcg[int(k)] ** 2 for s in mine),
                        **{name: figures[name] for name in ("ndcg_standard_error", "dcg_standard_error",
                                                            "ndcg_clustered_standard_error",
                                                            "dcg_clustered_standard_error", "ndcg_query_mean",
                                                            "queries")}}
                    for name, value in recomputed.items():
                        got = samples[(f"stream_ndcg_{name}", key)]
                        assert (math.isnan(got) if value is None else got == pytest.approx(value, abs=1e-9)), (
                            window, variant, k, name, got, value)
                        compared += 1
    assert compared > 100


@given(event_streams(), measures, st.lists(st.integers(1, 6), min_size=40, max_size=40))
def test_states_kept_from_batch_to_batch_keep_the_squares_of_a_recomputation(
        messages: list[bytes], measure: Measure, batch_sizes: list[int]) -> None:
    # As the Redis store's cache keeps them: each group's lists' DCGs and squares move with the
    # lists it takes and the grades that move, never scored afresh.
    engine = Engine(measure)
    kept: dict[str, QueryState] = {}
    known: dict[str, int] = {}
    aggregates: dict[AggregateKey, float] = {}
    replay = Replay(measure)
    for batch, _ in in_batches(messages, batch_sizes):
        outcome = engine.apply(parsed(batch), kept, known)
        kept.update(outcome.touched)
        for key, change in outcome.aggregates.items():
            aggregates[key] = aggregates.get(key, 0.0) + change
        for message in batch:
            replay.add(message)
        for segment, sums in recomputed(list(replay.per_impression()), measure.cutoffs).items():
            ours = field_sums({key: value for key, value in aggregates.items() if key[1] == segment})
            for name, value in sums.items():
                assert ours.get(name, 0.0) == pytest.approx(value, rel=1e-9, abs=1e-9), (segment, name)
