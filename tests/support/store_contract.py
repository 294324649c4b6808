"""The state-store contract: what every StateStore does, written once and run for each store.

A test module runs it for its store with a subclass that provides the `store` fixture, as
arroyo's tests/backends/mixins.py does for its consumers::

    class TestMemoryStore(StoreContract):
        @pytest.fixture
        def store(self) -> StateStore:
            return MemoryStore(bucket_ms=BUCKET, horizon_ms=HORIZON, dedup_horizon_ms=DEDUP_HORIZON)

The in-memory store runs it from tests/unit, the Redis stores from tests/integration.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pytest

from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.engine import Engine
from stream_ndcg.errors import ConfigError, FencedError
from stream_ndcg.events import Impression, InvalidEvent, parse_event
from stream_ndcg.experiments import Experiment, impression_cells
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay
from stream_ndcg.pipeline import BatchPipeline
from stream_ndcg.state.base import StateStore
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.vocabulary import DEFAULT_JUDGMENT_SOURCES, JUDGMENT, TOO_OLD, AggregateKey, duplicate, rejected
from stream_ndcg.window_sums import AggregateRead
from stream_ndcg.windows import window_means
from tests.support.batches import apply_batch, parsed

MEASURE = Measure(cutoffs=(3, 10))
BUCKET = 60_000
HORIZON = 3_600_000
# The stores under contract remember impression ids this long.
DEDUP_HORIZON = 10 * BUCKET
T0 = 1_763_683_200_000


def _summed(reads: Iterable[AggregateRead]) -> dict[AggregateKey, float]:
    return _summed_held({(read.partition, b): sums for read in reads for b, sums in read.buckets.items()})


def _summed_held(held: dict[tuple[str, int], dict[tuple[str, str], float]]) -> dict[AggregateKey, float]:
    """Per-partition bucket sums added up as `StateStore.aggregates` adds them."""
    parts: dict[AggregateKey, list[float]] = {}
    for (_, bucket), sums in held.items():
        for (segment, name), value in sums.items():
            parts.setdefault((bucket, segment, name), []).append(value)
    return {key: math.fsum(values) for key, values in parts.items()}


class StoreContract:
    """The contract's tests; a subclass named Test... runs them with its `store` fixture."""

    def test_claims_fence_earlier_holders(self, store: StateStore) -> None:
        first = store.claim("t:0")
        second = store.claim("t:0")
        assert second != first
        engine = Engine(MEASURE, BUCKET)
        with pytest.raises(FencedError):
            apply_batch(store, engine, "t:0", [], epoch=first, next_offset=1)
        assert store.next_offset("t:0") is None
        apply_batch(store, engine, "t:0", [], epoch=second, next_offset=7)
        assert store.next_offset("t:0") == 7
        assert store.next_offset("t:1") is None

    def test_commits_round_trip_and_add_up_across_partitions(self, store: StateStore) -> None:
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
        messages = [v for _, v in Simulator(SimulationSpec(events=3000, seed=3, queries=50, rate=50.0,
                                                             malformed_share=0.02)).messages()]
        epochs = {p: store.claim(p) for p in ("t:0", "t:1")}
        memory = MemoryStore(bucket_ms=BUCKET, horizon_ms=HORIZON)
        memory_epoch = memory.claim("all")
        for start in range(0, len(messages), 250):
            chunk = messages[start:start + 250]
            # Queries split by partition, as Kafka keys would split them.
            by_partition: dict[str, list[bytes]] = {"t:0": [], "t:1": []}
            for message in chunk:
                event = parse_event(message)
                key = event.query_id if not isinstance(event, InvalidEvent) else ""
                by_partition[f"t:{sum(key.encode()) % 2}"].append(message)
            redelivered = {partition: raw + raw[:3] for partition, raw in by_partition.items()}
            for partition, raw in redelivered.items():
                apply_batch(store, engine, partition, parsed(raw), epoch=epochs[partition], next_offset=start + 250)
            apply_batch(memory, engine, "all", parsed(redelivered["t:0"] + redelivered["t:1"]), epoch=memory_epoch,
                        next_offset=start + 250)
        assert store.counts() == memory.counts()
        assert store.clock_ms() == memory.clock_ms()
        ours = window_means(store.aggregates(), MEASURE.cutoffs)
        reference = window_means(memory.aggregates(), MEASURE.cutoffs)
        for k, row in reference.items():
            for name, value in row.items():
                assert ours[k][name] == pytest.approx(value, abs=1e-9), (k, name)
        assert store.counts()["duplicate:impression"] > 0
        oldest = min(key[0] for key in store.aggregates())
        assert store.aggregates(since_bucket=oldest + 1).keys() == {k for k in store.aggregates() if k[0] > oldest}

    def test_drill_down_rows_are_read_whole_then_as_what_changed(self, store: StateStore) -> None:
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
        messages = [v for _, v in Simulator(SimulationSpec(events=600, seed=5, queries=20, rate=5.0)).messages()]
        epoch = store.claim("t:0")
        apply_batch(store, engine, "t:0", parsed(messages[:300]), epoch=epoch, next_offset=300)
        whole = store.read_rows("t:0", None, since_bucket=0)
        assert whole.whole and whole.rows
        held = {(bucket, segment, query): row for bucket, segment, query, row in whole.rows}
        assert store.read_rows("t:0", whole.cursor, since_bucket=0).rows == []
        outcome = apply_batch(store, engine, "t:0", parsed(messages[300:]), epoch=epoch, next_offset=600)
        later = store.read_rows("t:0", whole.cursor, since_bucket=0)
        assert not later.whole and later.cursor != whole.cursor
        # Exactly the rows the batch wrote, as the engine made them (floats read back unchanged).
        assert sorted(later.rows) == sorted((b, s, q, row) for (q, b, s), row in outcome.rows.items())
        held.update({(bucket, segment, query): row for bucket, segment, query, row in later.rows})
        again = store.read_rows("t:0", None, since_bucket=0)
        assert {(bucket, segment, query): row for bucket, segment, query, row in again.rows} == held
        newest = max(bucket for bucket, _, _ in held)
        assert {b for b, _, _, _ in store.read_rows("t:0", None, since_bucket=newest).rows} == {newest}
        assert store.partitions() == ["t:0"]

    def test_a_row_written_again_since_the_cursor_is_read_once_as_last_written(self, store: StateStore) -> None:
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
        messages = [v for _, v in Simulator(SimulationSpec(events=600, seed=5, queries=20, rate=5.0)).messages()]
        epoch = store.claim("t:0")
        apply_batch(store, engine, "t:0", parsed(messages[:200]), epoch=epoch, next_offset=200)
        cursor = store.read_rows("t:0", None, since_bucket=0).cursor
        first = apply_batch(store, engine, "t:0", parsed(messages[200:400]), epoch=epoch, next_offset=400)
        second = apply_batch(store, engine, "t:0", parsed(messages[400:]), epoch=epoch, next_offset=600)
        # Both batches wrote rows of some groups: each is read once, as the second wrote it.
        assert first.rows.keys() & second.rows.keys()
        later = store.read_rows("t:0", cursor, since_bucket=0)
        assert not later.whole
        assert sorted(later.rows) == sorted((b, s, q, row) for (q, b, s), row in {**first.rows, **second.rows}.items())

    def test_every_partitions_rows_are_read_together_as_each_alone(self, store: StateStore) -> None:
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
        messages = [v for _, v in Simulator(SimulationSpec(events=900, seed=7, queries=20, rate=5.0)).messages()]
        partitions = ["t:0", "t:1", "t:2"]
        epochs = {p: store.claim(p) for p in partitions}
        for at, partition in enumerate(partitions):
            apply_batch(store, engine, partition, parsed(messages[at * 200:(at + 1) * 200]), epoch=epochs[partition],
                        next_offset=200)
        first = store.read_all_rows({}, since_bucket=0)
        assert list(first) == partitions
        assert all(read.whole and read.rows for read in first.values())
        assert first == {p: store.read_rows(p, None, since_bucket=0) for p in partitions}
        apply_batch(store, engine, "t:0", parsed(messages[600:750]), epoch=epochs["t:0"], next_offset=350)
        apply_batch(store, engine, "t:2", parsed(messages[750:]), epoch=epochs["t:2"], next_offset=350)
        # t:1 is read whole again, the others on from their cursors.
        cursors = {"t:0": first["t:0"].cursor, "t:1": None, "t:2": first["t:2"].cursor}
        later = store.read_all_rows(cursors, since_bucket=0)
        assert [later[p].whole for p in partitions] == [False, True, False]
        assert later["t:0"].rows and later["t:2"].rows
        assert later == {p: store.read_rows(p, cursors[p], since_bucket=0) for p in partitions}

    def test_aggregates_are_read_whole_then_as_the_buckets_changed_since_a_mark(self, store: StateStore) -> None:
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
        messages = [v for _, v in Simulator(SimulationSpec(events=900, seed=6, queries=20, rate=2.0)).messages()]
        epochs = {p: store.claim(p) for p in ("t:0", "t:1")}
        apply_batch(store, engine, "t:0", parsed(messages[:300]), epoch=epochs["t:0"], next_offset=300)
        apply_batch(store, engine, "t:1", parsed(messages[300:600]), epoch=epochs["t:1"], next_offset=300)
        first = {read.partition: read for read in store.read_aggregates({}, since_bucket=0)}
        assert sorted(first) == ["t:0", "t:1"] and all(read.whole for read in first.values())
        assert all(read.mark is not None for read in first.values())
        assert _summed(first.values()) == store.aggregates()
        marks = {p: read.mark for p, read in first.items() if read.mark is not None}
        assert all(not read.whole and not read.buckets for read in store.read_aggregates(marks, since_bucket=0))
        outcome = apply_batch(store, engine, "t:1", parsed(messages[600:]), epoch=epochs["t:1"], next_offset=600)
        later = {read.partition: read for read in store.read_aggregates(marks, since_bucket=0)}
        assert not later["t:0"].buckets and not later["t:1"].whole
        assert set(later["t:1"].buckets) == {bucket for bucket, _, _ in outcome.aggregates}
        held = {(p, b): sums for p, read in first.items() for b, sums in read.buckets.items()}
        held.update({("t:1", b): sums for b, sums in later["t:1"].buckets.items()})
        assert _summed_held(held) == store.aggregates()
        newest = max(bucket for _, bucket in held)
        assert {b for read in store.read_aggregates({}, since_bucket=newest) for b in read.buckets} == {newest}

    def test_a_mark_read_before_a_rebuild_reads_the_new_state_whole(self, store: StateStore) -> None:
        # The exporter shares its store with the consumer, which rebuilds after the exporter's
        # warm-up has read the state of before: offsets start again, below those marks.
        linear = {"k": [3, 10], "gain": "linear", "ideal": "pool"}
        store.adopt(linear)
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
        messages = [v for _, v in Simulator(SimulationSpec(events=600, seed=7, queries=20, rate=2.0)).messages()]
        apply_batch(store, engine, "t:0", parsed(messages), epoch=store.claim("t:0"), next_offset=600)
        marks = {read.partition: read.mark for read in store.read_aggregates({}, since_bucket=0)
                 if read.mark is not None}
        assert marks
        assert store.adopt(dict(linear, gain="exponential"), rebuild=True)
        apply_batch(store, engine, "t:0", parsed(messages[:100]), epoch=store.claim("t:0"), next_offset=100)
        after = list(store.read_aggregates(marks, since_bucket=0))
        assert [read.whole for read in after] == [True]
        assert _summed(after) == store.aggregates()

    def test_a_commit_from_another_offset_than_the_stored_one_is_refused(self, store: StateStore) -> None:
        engine = Engine(MEASURE, BUCKET)
        epoch = store.claim("t:0")
        apply_batch(store, engine, "t:0", [], epoch=epoch, next_offset=10, expected_offset=None)
        with pytest.raises(FencedError, match="offset"):
            apply_batch(store, engine, "t:0", [], epoch=epoch, next_offset=20, expected_offset=None)
        with pytest.raises(FencedError, match="offset"):
            apply_batch(store, engine, "t:0", [], epoch=epoch, next_offset=20, expected_offset=9)
        apply_batch(store, engine, "t:0", [], epoch=epoch, next_offset=20, expected_offset=10)
        assert store.next_offset("t:0") == 20

    def test_a_commit_begun_is_written_by_the_time_it_is_finished_and_refused_as_commit_refuses(
            self, store: StateStore) -> None:
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
        messages = [v for _, v in Simulator(SimulationSpec(events=400, seed=11, queries=10, rate=20.0)).messages()]
        pipeline = BatchPipeline(store, engine, event_clock=True)
        epoch = store.claim("t:0")
        sent = store.begin_commit([pipeline.stage("t:0", epoch, parsed(messages[:200]), 200, None, None)])
        # Meanwhile the store answers other requests (the Redis store's on other connections).
        store.claim("t:1")
        assert store.next_offset("t:1") is None
        sent.finish()
        assert store.next_offset("t:0") == 200
        # The same events committed in one step, in a store of their own, hold the same sums.
        memory = MemoryStore(bucket_ms=BUCKET, horizon_ms=HORIZON)
        apply_batch(memory, engine, "t:0", parsed(messages[:200]), epoch=memory.claim("t:0"), next_offset=200)
        assert store.counts() == memory.counts()
        assert store.aggregates().keys() == memory.aggregates().keys()
        for key, value in memory.aggregates().items():
            assert store.aggregates()[key] == pytest.approx(value, abs=1e-9), key
        stale = pipeline.stage("t:0", epoch, parsed(messages[200:]), 400, 200, None)
        store.claim("t:0")
        refused = store.begin_commit([stale])
        with pytest.raises(FencedError, match="newer holder"):
            refused.finish()
        assert store.next_offset("t:0") == 200
        assert store.counts() == memory.counts()

    def test_an_impression_id_seen_again_is_a_duplicate_whatever_its_time(self, store: StateStore) -> None:
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
        epoch = store.claim("t:0")
        first = b'{"type":"impression","impression_id":"i","query_id":"q","ts":%d,"results":["a"]}' % T0
        again = b'{"type":"impression","impression_id":"i","query_id":"q","ts":%d,"results":["a"]}' % (T0 + 5 * BUCKET)
        apply_batch(store, engine, "t:0", parsed([first]), epoch=epoch, next_offset=1)
        apply_batch(store, engine, "t:0", parsed([again]), epoch=epoch, next_offset=2)
        assert store.counts()["impression"] == 1
        assert store.counts()["duplicate:impression"] == 1

    def test_impression_ids_are_remembered_for_the_dedup_horizon_then_forgotten(self, store: StateStore) -> None:
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON, dedup_horizon_ms=DEDUP_HORIZON)
        epoch = store.claim("t:0")
        shown = b'{"type":"impression","impression_id":"%s","query_id":"q","ts":%d,"results":["a"]}'
        apply_batch(store, engine, "t:0", parsed([shown % (b"i", T0)]), epoch=epoch, next_offset=1)
        # A resend while the clock is within the dedup horizon of the first: a duplicate.
        apply_batch(store, engine, "t:0", parsed([shown % (b"i", T0 + 5 * BUCKET)]), epoch=epoch, next_offset=2)
        assert store.load("t:0", [], {"i": T0 // BUCKET}).known_impressions == {"i": T0 // BUCKET}
        # The clock passes the dedup horizon: the id is forgotten (its memory freed), and the
        # same id later is a new impression.
        later = T0 + DEDUP_HORIZON + 2 * BUCKET
        apply_batch(store, engine, "t:0", parsed([shown % (b"j", later)]), epoch=epoch, next_offset=3)
        assert store.load("t:0", [], {"i": later // BUCKET}).known_impressions == {}
        apply_batch(store, engine, "t:0", parsed([shown % (b"i", later)]), epoch=epoch, next_offset=4)
        assert store.counts()["impression"] == 3
        assert store.counts()["duplicate:impression"] == 1
        assert store.load("t:0", [], {"i": 0}).known_impressions == {"i": later // BUCKET}
        # An impression arriving late (its time far behind the clock, inside the horizon) is
        # remembered from when it arrived, so its resend in the next batch is a duplicate.
        late = later - DEDUP_HORIZON - 5 * BUCKET
        apply_batch(store, engine, "t:0", parsed([shown % (b"late", late)]), epoch=epoch, next_offset=5)
        apply_batch(store, engine, "t:0", parsed([shown % (b"late", late)]), epoch=epoch, next_offset=6)
        assert store.counts()["impression"] == 4
        assert store.counts()["duplicate:impression"] == 2

    def test_judgment_events_older_than_two_max_ages_are_forgotten_and_stay_too_old(self, store: StateStore) -> None:
        max_age = 10 * BUCKET
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON, judgment_max_age_ms=max_age)
        epoch = store.claim("t:0")
        judged = b'{"type":"judgment","query_id":"q","doc_id":"a","grade":%d,"ts":%d,"event_id":"%s"}'
        apply_batch(store, engine, "t:0", parsed([judged % (1, T0, b"e1"), judged % (2, T0 + BUCKET, b"e2")]),
                    epoch=epoch, next_offset=2)
        assert [r[:2] for r in store.load("t:0", ["q"], {}).states["q"].revisions["a"]] == [(T0, "e1"),
                                                                                          (T0 + BUCKET, "e2")]
        later = T0 + 2 * max_age + 2 * BUCKET
        apply_batch(store, engine, "t:0", parsed([judged % (3, later, b"e3")]), epoch=epoch, next_offset=3)
        state = store.load("t:0", ["q"], {}).states["q"]
        assert [r[:2] for r in state.revisions["a"]] == [(later, "e3")]
        assert state.grades(DEFAULT_JUDGMENT_SOURCES) == {"a": 3}
        # A forgotten event delivered again is too old, as it would have been remembered.
        apply_batch(store, engine, "t:0", parsed([judged % (1, T0, b"e1")]), epoch=epoch, next_offset=4)
        counts = store.counts()
        assert (counts[JUDGMENT], counts[rejected(TOO_OLD)], counts.get(duplicate(JUDGMENT), 0)) == (3, 1, 0)

    def test_each_sources_events_are_kept_and_forgotten_apart(self, store: StateStore) -> None:
        """Events of several sources appended to one stored list, each source's winner kept when old
        events are forgotten, and the grade the first listed source's."""
        max_age = 10 * BUCKET
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON, judgment_max_age_ms=max_age)
        epoch = store.claim("t:0")
        judged = b'{"type":"judgment","query_id":"q","doc_id":"a","grade":%s,"ts":%d,"source":"%s"}'
        apply_batch(store, engine, "t:0", parsed([judged % (b"1", T0, b"raters"), judged % (b"3", T0, b"coec")]),
                    epoch=epoch, next_offset=2)
        apply_batch(store, engine, "t:0", parsed([judged % (b"2", T0 + BUCKET, b"coec")]), epoch=epoch, next_offset=3)
        state = store.load("t:0", ["q"], {}).states["q"]
        assert state.revisions["a"] == [(T0, None, 1.0, "raters"), (T0, None, 3.0, "coec"),
                                        (T0 + BUCKET, None, 2.0, "coec")]
        assert state.grades(DEFAULT_JUDGMENT_SOURCES) == {"a": 1.0}
        later = T0 + 2 * max_age + 2 * BUCKET
        apply_batch(store, engine, "t:0", parsed([judged % (b"null", later, b"raters")]), epoch=epoch, next_offset=4)
        state = store.load("t:0", ["q"], {}).states["q"]
        assert sorted(state.revisions["a"]) == [(T0 + BUCKET, None, 2.0, "coec"), (later, None, None, "raters")]
        assert state.grades(DEFAULT_JUDGMENT_SOURCES) == {"a": 2.0}

    def test_ranked_lists_are_kept_deduplicated_with_counts(self, store: StateStore) -> None:
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
        epoch = store.claim("t:0")
        shown = [b'{"type":"impression","impression_id":"%d","query_id":"q","ts":%d,"results":["a","b"]}' % (i, T0 + i)
                 for i in range(3)]
        other = b'{"type":"impression","impression_id":"x","query_id":"q","ts":%d,"results":["b"],' \
                b'"segment":{"variant":"B"}}' % (T0 + BUCKET)
        # Documents first shown by a later batch, lists that repeat a document, and an empty list.
        later = [b'{"type":"impression","impression_id":"l%d","query_id":"q","ts":%d,"results":%s}' % (i, T0 + 9, r)
                 for i, r in enumerate([b'["c","a"]', b'["d","b","d"]', b"[]", b'["c","a"]'])]
        apply_batch(store, engine, "t:0", parsed(shown[:2]), epoch=epoch, next_offset=2)
        apply_batch(store, engine, "t:0", parsed([shown[2], other, *later[:2]]), epoch=epoch, next_offset=6)
        apply_batch(store, engine, "t:0", parsed(later[2:]), epoch=epoch, next_offset=8)
        bucket = T0 // BUCKET
        assert store.ranked_lists("t:0", "q") == {(bucket, "{}", ("a", "b")): 3, (bucket, "{}", ("c", "a")): 2,
                                                  (bucket, "{}", ("d", "b", "d")): 1, (bucket, "{}", ()): 1,
                                                  (bucket + 1, '{"variant":"B"}', ("b",)): 1}
        assert store.ranked_lists("t:0", "unknown") == {}

    def test_segment_values_are_admitted_up_to_the_cap(self, store: StateStore) -> None:
        assert [store.admit("variant", v, 2) for v in ("A", "B", "C", "A", "D", "B")] == [
            True, True, False, True, False, True]
        assert store.admit("engine", "x", 1)

    def test_state_built_with_another_metric_configuration_is_refused_unless_rebuilt(self, store: StateStore) -> None:
        linear = {"k": [3, 10], "gain": "linear", "ideal": "pool"}
        exponential = dict(linear, gain="exponential")
        assert store.adopt(linear) is False
        assert store.adopt(linear) is False
        engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
        shown = parsed([b'{"type":"impression","impression_id":"i","query_id":"q","ts":%d,"results":["a"]}' % T0])
        apply_batch(store, engine, "t:0", shown, epoch=store.claim("t:0"), next_offset=1)
        with pytest.raises(ConfigError, match="gain: state built with 'linear', configured 'exponential'"):
            store.adopt(exponential)
        assert store.counts()["impression"] == 1
        assert store.adopt(exponential, rebuild=True) is True
        assert store.next_offset("t:0") is None
        assert not store.counts() and not store.aggregates() and store.ranked_lists("t:0", "q") == {}
        apply_batch(store, engine, "t:0", shown, epoch=store.claim("t:0"), next_offset=1)
        assert store.counts()["impression"] == 1
        assert store.adopt(exponential, rebuild=True) is False
        with pytest.raises(ConfigError, match="gain"):
            store.adopt(linear)

    def test_experiment_cells_equal_a_recomputation_across_partitions_redeliveries_and_late_judgments(
            self, store: StateStore) -> None:
        spec = SimulationSpec(events=3000, seed=11, queries=40, rate=20.0, variants=(("A", 0.5), ("B", 2.0),
                                                                                   ("C", 1.0)))
        messages = [v for _, v in Simulator(spec).messages()]
        events = [parse_event(m) for m in messages]
        times = sorted(e.ts for e in events if isinstance(e, Impression))
        # From the middle of the stream, so that impressions before the start are left out, and
        # judgments after it re-credit groups the experiment counted.
        experiment = Experiment("exp-1", start_ms=times[len(times) // 3], label="variant", arms=("A", "B"),
                                control="A", alpha=0.05, n_star=1000)
        # No clock, so nothing expires: the late judgments find every group they re-credit.
        engine = Engine(MEASURE, BUCKET, query_credits=True)
        pipeline = BatchPipeline(store, engine, experiments=[experiment])
        epochs = {p: store.claim(p) for p in ("t:0", "t:1")}
        offsets = {"t:0": 0, "t:1": 0}
        for start in range(0, len(messages), 250):
            by_partition: dict[str, list[bytes]] = {"t:0": [], "t:1": []}
            for message, event in zip(messages[start:start + 250], events[start:start + 250], strict=True):
                key = event.query_id if not isinstance(event, InvalidEvent) else ""
                by_partition[f"t:{sum(key.encode()) % 2}"].append(message)
            for partition, raw in by_partition.items():
                # Each batch again in part: the duplicates count nowhere.
                pipeline.apply(partition, epochs[partition], parsed(raw + raw[:5]), offsets[partition] + 1,
                               store.next_offset(partition))
                offsets[partition] += 1
        replay = Replay(MEASURE, bucket_ms=BUCKET)
        for message in messages:
            replay.add(message)
        expected = impression_cells(experiment, ((item.impression.query_id, item.impression.ts,
                                                  dict(item.impression.segment), item.score.ndcg)
                                                 for item in replay.scored()), BUCKET)
        read = store.experiment("exp-1")
        assert read.first_buckets == {"t:0": experiment.first_bucket(BUCKET), "t:1": experiment.first_bucket(BUCKET)}
        assert {arm for arm, _, _ in read.cells} == {"A", "B"}
        # A sum the engine never moved from 0 is not held at all.
        assert {key for key, value in expected.items() if value} <= read.cells.keys() <= expected.keys()
        for cell, value in expected.items():
            assert read.cells.get(cell, 0.0) == pytest.approx(value, abs=1e-9), cell
        assert store.experiment("not-registered").cells == {}

    def test_an_experiment_registered_on_held_state_counts_from_the_bucket_after_the_clock(
            self, store: StateStore) -> None:
        messages = [v for _, v in Simulator(SimulationSpec(events=600, seed=12, queries=10, rate=2.0)).messages()]
        experiment = Experiment("late", start_ms=0, label="variant", arms=("A", "B"), control="A")
        epoch = store.claim("t:0")
        BatchPipeline(store, Engine(MEASURE, BUCKET, horizon_ms=HORIZON), event_clock=True).apply(
            "t:0", epoch, parsed(messages[:300]), 300, None)
        clock = store.clock_ms()
        assert clock is not None
        pipeline = BatchPipeline(store, Engine(MEASURE, BUCKET, horizon_ms=HORIZON, query_credits=True),
                                 event_clock=True, experiments=[experiment])
        pipeline.apply("t:0", epoch, parsed(messages[300:]), 600, 300)
        read = store.experiment("late")
        mark = clock // BUCKET + 1
        assert read.first_buckets == {"t:0": mark}
        # Every impression of the arms from the mark on, and none before it.
        impressions = [e for e in parsed(messages) if isinstance(e, Impression)]
        counted = [e for e in impressions if e.ts // BUCKET >= mark and dict(e.segment)["variant"] in ("A", "B")]
        assert counted and len(counted) < len(impressions)
        assert math.fsum(value for (_, _, figure), value in read.cells.items() if figure == "impressions") == len(
            counted)
