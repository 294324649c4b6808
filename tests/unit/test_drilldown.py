"""The drill-down against the replay: the service's path (engine rows -> store -> index sliding
along) and the batch path (every impression scored from scratch) give the same per-query figures,
judging queue and lists, to 1e-9, at several points of the stream."""

from __future__ import annotations

import json
import math
import random
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from stream_ndcg import rows
from stream_ndcg.comparisons import ALPHA, N_STAR
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.drilldown import index
from stream_ndcg.drilldown.compare import against
from stream_ndcg.drilldown.explorer import Explorer
from stream_ndcg.drilldown.question import Question
from stream_ndcg.engine import Engine
from stream_ndcg.errors import BadParameter, NotFound
from stream_ndcg.exporter import WindowView
from stream_ndcg.metric import Ideal, Measure, discount, first_occurrences, score_list
from stream_ndcg.offline.replay import Replay
from stream_ndcg.offline.totals import OVER_QUERIES, REPORTED, ScoreTotals
from stream_ndcg.setting_values import format_duration
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.vocabulary import AggregateKey, full_segment_key, segment_values
from stream_ndcg.window_sums import AggregateRead
from tests.support.batches import apply_batch, parsed
from tests.support.drilldown import query_table

BUCKET = 60_000
WINDOWS = (60_000, 180_000)
HORIZON = 1_800_000
TOLERANCE = 1e-9


def messages(events: int = 3_000) -> list[bytes]:
    spec = SimulationSpec(events=events, seed=7, queries=150, rate=8.0, max_delay_ms=240_000)
    return [value for _, value in Simulator(spec).messages()]


def partition_of(message: bytes) -> str:
    """Two partitions keyed by query, as a producer keying by query id would split them."""
    event = parsed([message])[0]
    query_id = getattr(event, "query_id", "")
    return f"events:{zlib.crc32(query_id.encode()) % 2}"


class Fed:
    """A MemoryStore fed batch by batch through the service's pipeline, with an Explorer on it."""

    def __init__(self, measure: Measure, store: MemoryStore | None = None) -> None:
        self.store = store or MemoryStore(bucket_ms=BUCKET, horizon_ms=HORIZON)
        self.engine = Engine(measure, BUCKET, horizon_ms=HORIZON)
        self.view = WindowView(cutoffs=measure.cutoffs, windows_ms=WINDOWS, bucket_ms=BUCKET,
                               segment_labels=("variant",), event_clock=True)
        self.explorer = Explorer(self.store, self.view, measure, HORIZON)
        self.offsets: dict[str, int] = {}
        self.epochs: dict[str, str] = {}

    def feed(self, batch: Sequence[bytes]) -> None:
        by_partition: dict[str, list[bytes]] = {}
        for message in batch:
            by_partition.setdefault(partition_of(message), []).append(message)
        for partition, part in sorted(by_partition.items()):
            if partition not in self.epochs:
                self.epochs[partition] = self.store.claim(partition)
            self.offsets[partition] = self.offsets.get(partition, 0) + len(part)
            apply_batch(self.store, self.engine, partition, parsed(part), epoch=self.epochs[partition],
                        next_offset=self.offsets[partition])


def replay_of(measure: Measure, applied: Sequence[bytes]) -> Replay:
    replay = Replay(measure)
    for message in applied:
        replay.add(message)
    return replay


def window_of(replay: Replay, window_ms: int, lag: int = 0) -> tuple[int, int]:
    assert replay.latest_ts is not None
    last = replay.latest_ts // BUCKET - lag * window_ms // BUCKET
    return last - window_ms // BUCKET + 1, last


def close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def expected_records(replay: Replay, question: Question, measure: Measure) -> dict[str, dict[str, Any]]:
    first, last = window_of(replay, question.window_ms)
    table = query_table(replay.query_rows(first, last, BUCKET), question.segment)
    other = None
    if question.vs == "previous":
        before = window_of(replay, question.window_ms, lag=1)
        other = query_table(replay.query_rows(*before, BUCKET), question.segment)
    elif isinstance(question.vs, tuple):
        label, value = question.vs
        other = query_table(replay.query_rows(first, last, BUCKET), {**question.segment, label: value})
    at = measure.cutoffs.index(question.k)
    _, records = index.page(table, other, at, min_impressions=question.min_impressions, sort=question.sort,
                                descending=question.descending, offset=0, limit=len(table))
    return {r["query_id"]: r for r in records}


def expected_summary(replay: Replay, window_ms: int, measure: Measure) -> dict[tuple[str, ...], dict[str, Any]]:
    """Per variant, the window's means, each impression scored from scratch."""
    first, last = window_of(replay, window_ms)
    by_variant: dict[tuple[str, ...], ScoreTotals] = {}
    for item in replay.scored():
        if first <= item.impression.ts // BUCKET <= last:
            variant = tuple(segment_values(full_segment_key(item.impression.segment), ("variant",)))
            by_variant.setdefault(variant, ScoreTotals(measure.cutoffs)).add(item.score, item.impression.query_id)
    return {variant: totals.means() for variant, totals in by_variant.items()}


def assert_summary_equal(answer: dict[str, Any], expected: dict[tuple[str, ...], dict[str, Any]]) -> None:
    got = {(row["segment"]["variant"],): row for row in answer["rows"]}
    assert got.keys() == expected.keys()
    for variant, row in got.items():
        for k, figures in expected[variant].items():
            assert row["impressions"] == figures["impressions"]
            # The means with their errors, and the figures over the window's queries.
            for name in (*REPORTED, *OVER_QUERIES, "scored_impressions"):
                assert close(row["k"][k][name], figures[name]), (variant, k, name, row["k"][k][name], figures[name])


def expected_comparisons(replay: Replay, window_ms: int, measure: Measure) -> dict[str, Any]:
    """B against A in the window, each impression scored from scratch."""
    first, last = window_of(replay, window_ms)
    by_variant: dict[str, ScoreTotals] = {}
    for item in replay.scored():
        if first <= item.impression.ts // BUCKET <= last:
            variant = segment_values(full_segment_key(item.impression.segment), ("variant",))[0]
            by_variant.setdefault(variant, ScoreTotals(measure.cutoffs)).add(item.score, item.impression.query_id)
    return {str(k): against({variant: totals.arm(i) for variant, totals in by_variant.items()}, "A", ALPHA, N_STAR)
            for i, k in enumerate(measure.cutoffs)}


def assert_comparisons_equal(answer: dict[str, Any], expected: dict[str, Any]) -> None:
    assert answer["control"] == {"label": "variant", "value": "A"}
    assert answer["k"].keys() == expected.keys()
    for k, result in answer["k"].items():
        assert result["arms"].keys() == expected[k]["arms"].keys() and result["arms"]
        for arm, kinds in result["arms"].items():
            for kind, got in kinds.items():
                want = expected[k]["arms"][arm][kind]
                assert (got is None) == (want is None), (k, arm, kind)
                for name in got or {}:
                    assert close(got[name], want[name]), (k, arm, kind, name, got[name], want[name])


def assert_records_equal(got: list[dict[str, Any]], expected: dict[str, dict[str, Any]]) -> None:
    assert {r["query_id"] for r in got} == set(expected)
    for record in got:
        want = expected[record["query_id"]]
        for name in index.FIGURES:
            assert close(record[name], want[name]), (record["query_id"], name, record[name], want[name])
        for side in ("vs", "change"):
            assert (record[side] is None) == (want[side] is None)
            for name, value in (record[side] or {}).items():
                assert close(value, want[side][name]), (record["query_id"], side, name, value, want[side][name])


def unjudged_pairs(replay: Replay, measure: Measure, question: Question) -> dict[tuple[str, str], float]:
    """The judging queue's exposures, impression by impression."""
    first, last = window_of(replay, question.window_ms)
    parts: dict[tuple[str, str], list[float]] = {}
    for item in replay.scored():
        impression = item.impression
        segment = dict(impression.segment)
        if not first <= impression.ts // BUCKET <= last:
            continue
        if any(segment.get(label, "none") != value for label, value in question.segment.items()):
            continue
        grades = replay.grades(impression.query_id)
        for rank, doc in first_occurrences(impression.results, measure.depth):
            if rank <= question.k and doc not in grades:
                parts.setdefault((impression.query_id, doc), []).append(discount(rank))
    return {pair: math.fsum(values) for pair, values in parts.items()}


QUESTIONS = [
    {},
    {"window": ["3m"], "k": ["5"]},
    {"window": ["1m"], "segment.variant": ["B"]},
    {"window": ["3m"], "vs": ["previous"], "sort": ["change_ndcg"]},
    {"window": ["3m"], "segment.variant": ["B"], "vs": ["variant:A"], "min_impressions": ["2"]},
]


@pytest.mark.parametrize("ideal", ["pool", "list"])
def test_the_drill_down_equals_the_replay_as_the_stream_goes_on(ideal: Ideal) -> None:
    measure = Measure(cutoffs=(5, 10), ideal=ideal)
    stream = messages()
    fed = Fed(measure)
    checked = 0
    for end in range(200, len(stream) + 1, 200):
        fed.feed(stream[end - 200:end])
        if end % 1000:
            # Asked between checks too, so that the index's windows slide and take rows in place.
            fed.explorer.queries(Question.parse({"window": ["3m"], "vs": ["previous"]}, fed.view))
            continue
        replay = replay_of(measure, stream[:end])
        for params in QUESTIONS:
            question = Question.parse({**params, "limit": ["1000"]}, fed.view)
            answer = fed.explorer.queries(question)
            assert answer["total"] == len(answer["queries"]) > 0
            assert_records_equal(answer["queries"], expected_records(replay, question, measure))
            checked += 1
        for window_ms in WINDOWS:
            summary = fed.explorer.summary(Question.parse({"window": [format_duration(window_ms)],
                                                           "control": ["variant:A"]}, fed.view))
            assert_summary_equal(summary, expected_summary(replay, window_ms, measure))
            assert_comparisons_equal(summary["comparisons"], expected_comparisons(replay, window_ms, measure))
            # Every figure of every row, exposure too (the judging queue's bound).
            held = fed.explorer.index.window(*window_of(replay, window_ms), {})
            expected_rows = query_table(replay.query_rows(*window_of(replay, window_ms), BUCKET), {})
            assert held.keys() == expected_rows.keys()
            for key, row in held.items():
                assert all(map(close, row, expected_rows[key])), (key, row, expected_rows[key])
    assert checked == 3 * len(QUESTIONS)


@pytest.mark.parametrize("ideal", ["pool", "list"])
def test_the_judging_queue_holds_the_pairs_of_most_unjudged_exposure(ideal: Ideal) -> None:
    measure = Measure(cutoffs=(5, 10), ideal=ideal)
    stream = messages()
    fed = Fed(measure)
    questions = ({"window": ["3m"], "limit": ["25"]}, {"window": ["1m"], "k": ["5"], "segment.variant": ["A"]})
    fed.feed(stream[:1600])
    # Asked before the rest arrives: what the explorer kept of the states must not outlive their changes.
    for params in questions:
        fed.explorer.judging_queue(Question.parse(params, fed.view, kind="judging-queue"))
    fed.feed(stream[1600:])
    replay = replay_of(measure, stream)
    for params in questions:
        question = Question.parse(params, fed.view, kind="judging-queue")
        answer = fed.explorer.judging_queue(question)
        expected = unjudged_pairs(replay, measure, question)
        pairs = answer["pairs"]
        assert len(pairs) == min(question.limit, len(expected)) > 0
        for pair in pairs:
            assert close(pair["exposure"], expected[(pair["query_id"], pair["doc_id"])]), pair
        ranked = sorted(expected.values(), reverse=True)
        assert [p["exposure"] for p in pairs] == sorted((p["exposure"] for p in pairs), reverse=True)
        # The last pair listed holds as much as the last of the oracle's top: none better was left out.
        assert close(pairs[-1]["exposure"], ranked[len(pairs) - 1])
        first, last = window_of(replay, question.window_ms)
        rows = query_table(replay.query_rows(first, last, BUCKET), question.segment)
        assert close(answer["total_exposure"], index.total_exposure(rows, measure.cutoffs.index(question.k)))
        assert all(close(p["share"], p["exposure"] / answer["total_exposure"]) for p in pairs)


def test_a_query_shows_its_lists_scored_against_its_grades_and_its_judgment_history() -> None:
    measure = Measure(cutoffs=(5, 10))
    stream = messages()
    fed = Fed(measure)
    fed.feed(stream)
    replay = replay_of(measure, stream)
    question = Question.parse({"window": ["3m"]}, fed.view)
    worst = fed.explorer.queries(Question.parse({"window": ["3m"], "sort": ["impressions"], "order": ["desc"]},
                                                fed.view))["queries"][0]
    detail = fed.explorer.query(worst["query_id"], question)
    grades = replay.grades(worst["query_id"])
    assert sum(entry["impressions"] for entry in detail["lists"]) == worst["impressions"]
    assert detail["lists_total"] == len(detail["lists"]) > 1
    assert detail["to_ms"] - detail["from_ms"] == 180_000
    capped = fed.explorer.query(worst["query_id"], Question.parse({"window": ["3m"], "limit": ["1"]}, fed.view,
                                                                   kind="query"))
    assert capped["lists"] == detail["lists"][:1] and capped["lists_total"] == detail["lists_total"]
    for entry in detail["lists"]:
        ranked = [r["doc_id"] for r in entry["results"]]
        score = score_list(ranked, grades, measure)
        assert all(close(entry["ndcg"][str(k)], score.ndcg[k]) for k in measure.cutoffs)
        assert all(r["grade"] == grades.get(r["doc_id"]) for r in entry["results"])
    assert [o["doc_id"] for o in detail["ideal_ordering"]] == sorted(grades, key=lambda d: (-grades[d], d))
    assert {doc for doc, history in detail["judgments"].items() if history[-1]["grade"] is not None} >= set(grades)
    assert close(detail["summary"]["k"]["10"]["ndcg"], worst["ndcg"])
    with pytest.raises(NotFound, match="query_id"):
        fed.explorer.query("never-seen", question)


@pytest.mark.parametrize(("params", "named"), [
    ({"window": ["2h"]}, "window"),
    ({"k": ["7"]}, "k"),
    ({"k": ["ten"]}, "k"),
    ({"limit": ["5000"]}, "limit"),
    ({"limit": ["0"]}, "limit"),
    ({"sort": ["name"]}, "sort"),
    ({"sort": ["change_ndcg"]}, "sort"),
    ({"order": ["up"]}, "order"),
    ({"vs": ["colour:red"]}, "vs"),
    ({"segment.colour": ["red"]}, "segment.colour"),
    ({"window": ["1m", "3m"]}, "window"),
    ({"pretty": ["1"]}, "pretty"),
])
def test_a_bad_parameter_is_refused_with_its_name(params: dict[str, list[str]], named: str) -> None:
    view = WindowView(cutoffs=(5, 10), windows_ms=WINDOWS, bucket_ms=BUCKET, segment_labels=("variant",),
                      event_clock=True)
    with pytest.raises(BadParameter) as refused:
        Question.parse(params, view)
    assert str(refused.value).startswith(f"{named}: ")


def test_a_comparison_behind_the_horizon_is_refused() -> None:
    measure = Measure(cutoffs=(5, 10))
    fed = Fed(measure)
    fed.explorer.horizon_ms = 240_000
    fed.feed(messages(1_000))
    with pytest.raises(BadParameter, match="^vs: .*horizon"):
        fed.explorer.queries(Question.parse({"window": ["3m"], "vs": ["previous"]}, fed.view))


def test_with_drilldown_off_the_engine_writes_no_rows_and_the_same_aggregates() -> None:
    measure = Measure(cutoffs=(5, 10))
    events = parsed(messages(500))
    on = Engine(measure, BUCKET, horizon_ms=HORIZON).apply(events, {}, {})
    off = Engine(measure, BUCKET, horizon_ms=HORIZON, drilldown=False).apply(events, {}, {})
    assert on.rows and not off.rows
    assert off.aggregates == on.aggregates


class CountedStore(MemoryStore):
    """Counts the buckets the aggregate reads return; a read of every bucket fails."""

    buckets_read = 0

    def read_aggregates(self, marks: Mapping[str, str], since_bucket: int) -> Iterator[AggregateRead]:
        for read in super().read_aggregates(marks, since_bucket):
            self.buckets_read += len(read.buckets)
            yield read

    def aggregates(self, since_bucket: int | None = None) -> dict[AggregateKey, float]:
        raise AssertionError("every bucket read")


def test_the_summary_reads_the_buckets_that_changed_since_the_last_answer() -> None:
    store = CountedStore(bucket_ms=BUCKET, horizon_ms=HORIZON)
    fed = Fed(Measure(cutoffs=(5, 10)), store)
    stream = messages()
    fed.feed(stream[:2_000])
    question = Question.parse({"window": ["3m"]}, fed.view)
    fed.explorer.summary(question)
    assert store.buckets_read > 0
    store.buckets_read = 0
    assert fed.explorer.summary(question)["rows"]
    assert store.buckets_read == 0
    fed.feed(stream[2_000:2_010])
    fed.explorer.summary(question)
    assert 0 < store.buckets_read <= 10


@pytest.mark.parametrize("sort", index.SORTS)
@pytest.mark.parametrize("descending", [False, True])
def test_a_page_is_the_slice_of_the_whole_ranking(sort: str, descending: bool) -> None:
    """`page` builds only the records it shows: each page is that slice of the full order (missing
    values last, ties by query id), whatever the offset."""
    rng = random.Random(f"{sort}{descending}")
    fields = len(rows.row_fields((10,)))

    def row() -> list[float]:
        values = [float(rng.randint(0, 3)) for _ in range(fields)]
        values[0] = float(rng.randint(1, 4))
        return values

    table = {f"q{i:02d}": row() for i in range(40)}
    other = {query_id: row() for query_id in list(table)[::2]}
    total, everything = index.page(table, other, 0, min_impressions=2, sort=sort, descending=descending,
                                       offset=0, limit=1000)
    assert total == len(everything) == sum(1 for r in table.values() if r[0] >= 2)

    def value(record: dict[str, Any]) -> Any:
        return (record["change"] or {}).get(sort.removeprefix("change_")) if sort.startswith("change_") \
            else record[sort]

    present = [r for r in everything if value(r) is not None]
    assert everything == present + [r for r in everything if value(r) is None]
    keys = [(value(r), r["query_id"]) for r in present]
    if sort == "query_id":
        assert keys == sorted(keys, reverse=descending)
    else:
        assert keys == sorted(keys, key=lambda k: (-k[0] if descending else k[0], k[1]))
    for offset in (0, 7, 30, 45):
        _, shown = index.page(table, other, 0, min_impressions=2, sort=sort, descending=descending,
                                  offset=offset, limit=9)
        assert shown == everything[offset:offset + 9]


def test_what_the_queue_kept_of_a_query_is_read_again_when_the_query_changes() -> None:
    """The explorer keeps what it read of the head queries' states between requests: a new
    impression or a judgment of a query must make it read that query again."""
    measure = Measure(cutoffs=(5, 10))
    stream = messages()
    fed = Fed(measure)
    fed.feed(stream)
    question = Question.parse({"window": ["3m"], "limit": ["10"]}, fed.view, kind="judging-queue")
    top = fed.explorer.judging_queue(question)["pairs"][0]
    assert fed.explorer.judging_queue(question)["pairs"][0] == top
    last_ts = max(json.loads(message)["ts"] for message in stream[-20:])
    # Shown once more at rank 1: its exposure grows by 1 / log2(2).
    fed.feed([json.dumps({"type": "impression", "impression_id": "again", "query_id": top["query_id"],
                          "ts": last_ts, "results": [top["doc_id"]], "segment": {"variant": "A"}}).encode()])
    grown = fed.explorer.judging_queue(question)["pairs"][0]
    assert (grown["query_id"], grown["doc_id"]) == (top["query_id"], top["doc_id"])
    assert close(grown["exposure"], top["exposure"] + 1.0)
    fed.feed([json.dumps({"type": "judgment", "query_id": top["query_id"], "doc_id": top["doc_id"], "grade": 2,
                          "ts": last_ts, "event_id": "judged-now"}).encode()])
    after = fed.explorer.judging_queue(question)["pairs"]
    assert (top["query_id"], top["doc_id"]) not in {(p["query_id"], p["doc_id"]) for p in after}
