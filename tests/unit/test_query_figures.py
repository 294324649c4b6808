"""The figures over queries brought up to date at most once per interval: when `latest` computes
them and when it serves the last computation, on an injected clock (no timing)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from stream_ndcg.drilldown.explorer import Explorer
from stream_ndcg.drilldown.question import Question
from stream_ndcg.errors import StoreUnavailable
from stream_ndcg.exporter import Exporter
from stream_ndcg.metric import Measure
from stream_ndcg.query_figures import Figures, Pacer, PeriodicQueryFigures, Wanted
from tests.unit.test_drilldown import Fed, messages

FIVE_MINUTES = 300_000
HOUR = 3_600_000


class Counted:
    """A computation that says how many times it ran and what it was asked: each figure is the
    number of the run, and the windows' end."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, dict[int, set[tuple[str, ...]]]]] = []
        self.failures = 0

    def __call__(self, now_ms: int, wanted: Wanted) -> Figures:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("redis down")
        asked = {window: set(values) for window, values in wanted.items()}
        self.runs.append((now_ms, asked))
        return {window: {v: [{"queries": float(len(self.runs)), "now_ms": float(now_ms)}] for v in values}
                for window, values in asked.items()}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def computed() -> Counted:
    return Counted()


@pytest.fixture
def figures(computed: Counted, clock: Clock) -> Iterator[PeriodicQueryFigures]:
    held = PeriodicQueryFigures(computed, lambda: 7_000, interval_s=5.0, clock=clock)
    yield held
    held.stop()


def run_of(held: PeriodicQueryFigures, window: int = FIVE_MINUTES, values: tuple[str, ...] = ("A",)) -> float | None:
    return held.latest(1, {window: [values]}).figures[window][values][0]["queries"]


def test_within_the_interval_the_last_computation_is_served(figures: PeriodicQueryFigures, computed: Counted,
                                                           clock: Clock) -> None:
    assert run_of(figures) == 1.0
    clock.now += 4.9
    assert run_of(figures) == 1.0
    assert len(computed.runs) == 1
    served = figures.latest(2, {FIVE_MINUTES: [("A",)]})
    # Where the windows ended and when: those of the computation served, not of the call.
    assert (served.now_ms, served.at_s) == (1, 1_000.0)


def test_once_the_interval_has_run_out_a_call_computes_them_again(figures: PeriodicQueryFigures, computed: Counted,
                                                                 clock: Clock) -> None:
    run_of(figures)
    clock.now += 5.0
    assert run_of(figures) == 2.0
    clock.now += 1.0
    assert run_of(figures) == 2.0


def test_a_clock_set_back_computes_them_again(figures: PeriodicQueryFigures, clock: Clock) -> None:
    run_of(figures)
    clock.now -= 60.0
    assert run_of(figures) == 2.0


def test_an_interval_of_zero_computes_them_on_every_call(computed: Counted, clock: Clock) -> None:
    held = PeriodicQueryFigures(computed, lambda: 7_000, interval_s=0.0, clock=clock)
    assert [run_of(held) for _ in range(3)] == [1.0, 2.0, 3.0]
    held.start()
    assert not held.refreshing()
    with pytest.raises(ValueError, match="an interval of -1"):
        PeriodicQueryFigures(computed, lambda: 7_000, interval_s=-1.0)


def test_a_window_or_segment_value_not_computed_yet_is_computed_at_once_with_what_was_asked_before(
        figures: PeriodicQueryFigures, computed: Counted) -> None:
    run_of(figures, values=("A",))
    assert run_of(figures, values=("B",)) == 2.0
    assert computed.runs[-1][1] == {FIVE_MINUTES: {("A",), ("B",)}}
    assert run_of(figures, window=HOUR) == 3.0
    assert computed.runs[-1][1] == {FIVE_MINUTES: {("A",), ("B",)}, HOUR: {("A",)}}
    # Everything computed is served; nothing asked for is left out.
    assert run_of(figures, values=("B",)) == 3.0
    assert len(computed.runs) == 3


def test_a_refresh_computes_every_window_and_segment_values_asked_for_so_far_the_windows_ending_now(
        figures: PeriodicQueryFigures, computed: Counted) -> None:
    assert figures.refresh() is None
    assert computed.runs == []
    run_of(figures, values=("A",))
    run_of(figures, window=HOUR, values=("B",))
    refreshed = figures.refresh()
    assert refreshed is not None and refreshed.now_ms == 7_000
    assert computed.runs[-1] == (7_000, {FIVE_MINUTES: {("A",)}, HOUR: {("B",)}})
    assert run_of(figures) == 3.0
    figures.refresh()
    assert computed.runs[-1] == (7_000, {FIVE_MINUTES: {("A",)}, HOUR: {("B",)}})
    assert run_of(figures, window=HOUR, values=("B",)) == 4.0


def test_no_refresh_before_any_event(computed: Counted, clock: Clock) -> None:
    held = PeriodicQueryFigures(computed, lambda: None, interval_s=5.0, clock=clock)
    run_of(held)
    assert held.refresh() is None
    assert len(computed.runs) == 1


def test_while_a_refresher_runs_a_call_never_computes_them_for_their_age(
        computed: Counted, clock: Clock) -> None:
    # An interval the test never sees run out: the refresher waits, and the calls find it running.
    held = PeriodicQueryFigures(computed, lambda: 7_000, interval_s=3_600.0, clock=clock)
    run_of(held)
    held.start()
    try:
        assert held.refreshing()
        clock.now += 7_200.0
        assert run_of(held) == 1.0
        # A segment value never computed is still computed at once.
        assert run_of(held, values=("B",)) == 2.0
    finally:
        held.stop()
    assert not held.refreshing()
    clock.now += 7_200.0
    assert run_of(held) == 3.0


def test_the_refresher_outlives_an_unreachable_store_and_serves_the_last_computation_meanwhile(
        computed: Counted, clock: Clock) -> None:
    held = PeriodicQueryFigures(computed, lambda: 7_000, interval_s=0.001, clock=clock)
    run_of(held)
    computed.failures = 3
    held.start()
    try:
        deadline = time.monotonic() + 30
        while len(computed.runs) < 2 and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        assert computed.failures == 0 and len(computed.runs) >= 2
        assert held.refreshing()
    finally:
        held.stop()


def test_the_pacer_sleeps_after_each_slice_of_work_long_enough_to_keep_to_its_share(clock: Clock) -> None:
    slept: list[float] = []
    pacer = Pacer(share=0.25, slice_s=0.005, clock=clock, sleep=slept.append)
    pacer()
    assert slept == []  # no thread paced yet
    pacer.pace(threading.get_ident())
    clock.now += 0.004
    pacer()
    assert slept == []  # within the slice
    clock.now += 0.002
    pacer()
    assert slept == [pytest.approx(0.015)]  # 5 ms of work, then three times that at rest
    clock.now += 0.001
    pacer()
    assert len(slept) == 1  # a new slice began after the rest


def test_the_pacer_leaves_every_other_thread_alone(clock: Clock) -> None:
    slept: list[float] = []
    pacer = Pacer(share=0.5, slice_s=0.001, clock=clock, sleep=slept.append)
    pacer.pace(threading.get_ident() + 1)
    clock.now += 1.0
    pacer()
    assert slept == []
    with pytest.raises(ValueError, match="a share of 0"):
        Pacer(share=0)


def test_the_refresher_paces_its_own_computations_and_no_others(computed: Counted, clock: Clock) -> None:
    held = PeriodicQueryFigures(computed, lambda: 7_000, interval_s=0.001, clock=clock, pacer=Pacer())
    assert held.pacer.thread_id is None  # a scrape's or a request's computation is not paced
    run_of(held)
    held.start()
    try:
        deadline = time.monotonic() + 30
        while len(computed.runs) < 2 and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        thread = held._thread
        assert thread is not None and held.pacer.thread_id == thread.ident
    finally:
        held.stop()


def test_the_exporter_serves_the_figures_of_the_last_computation_with_its_time() -> None:
    measure = Measure(cutoffs=(5,))
    stream = messages(2_000)
    fed = Fed(measure)
    clock = Clock()
    held = PeriodicQueryFigures(fed.explorer.query_figures, lambda: fed.view.now_ms(fed.store, clock), 60.0, clock)
    registry = CollectorRegistry()
    Exporter(registry, fed.store, fed.view).export_query_figures(held)
    labels = {"pipeline": "", "k": "5", "window": "1m", "variant": "A"}

    def exported() -> tuple[float | None, float | None, float | None]:
        return (registry.get_sample_value("stream_ndcg_queries", labels),
                registry.get_sample_value("stream_ndcg_scored_impressions", labels),
                registry.get_sample_value("stream_ndcg_query_figures_timestamp_seconds", {"pipeline": ""}))

    fed.feed(stream[:1_000])
    queries, scored, at = exported()
    assert queries and scored and at == 1_000.0
    fed.feed(stream[1_000:])
    clock.now += 30.0
    # The window sums are read at each scrape; the figures over queries are those computed before.
    stale, later, at = exported()
    assert later != scored and (stale, at) == (queries, 1_000.0)
    assert held.refresh() is not None
    fresh, _, at = exported()
    assert at == 1_030.0
    assert fresh == float(len(fed.explorer.index.window(*fed.view.window_buckets(fed.store.clock_ms() or 0, 60_000),
                                                        {"variant": "A"})))


def test_the_summary_says_where_and_when_its_figures_over_queries_were_computed() -> None:
    measure = Measure(cutoffs=(5,))
    stream = messages(2_000)
    fed = Fed(measure)
    clock = Clock()
    explorer = Explorer(fed.store, fed.view, measure, 1_800_000, clock, query_figures_interval_s=60.0)
    question = Question.parse({"window": ["1m"]}, fed.view)
    fed.feed(stream[:1_000])
    first = explorer.summary(question)
    assert (first["query_figures_as_of_ms"], first["query_figures_age_s"]) == (first["now_ms"], 0.0)
    fed.feed(stream[1_000:])
    clock.now += 12.5
    later = explorer.summary(question)
    assert later["now_ms"] > first["now_ms"]
    assert (later["query_figures_as_of_ms"], later["query_figures_age_s"]) == (first["now_ms"], 12.5)
    assert [row["k"]["5"]["queries"] for row in later["rows"]] == [row["k"]["5"]["queries"] for row in first["rows"]]
    clock.now += 60.0
    fresh = explorer.summary(question)
    assert (fresh["query_figures_as_of_ms"], fresh["query_figures_age_s"]) == (fresh["now_ms"], 0.0)
