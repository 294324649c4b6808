"""The judge-store contract: what every JudgeStore does, written once and run for each store (as
tests/support/store_contract.py does for the state stores). The in-memory store runs it from
tests/unit, the Redis store from tests/integration."""

from __future__ import annotations

import pytest

from stream_ndcg.click_judge import ClickJudge, JudgeSettings
from stream_ndcg.click_models import Grading
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.errors import FencedError
from stream_ndcg.events import Click, Impression, parse_event
from stream_ndcg.state import judge_format
from stream_ndcg.state.judge_store import JudgeCommit, JudgeStore, Status

MINUTE = 60_000
SETTINGS = JudgeSettings(Grading("coec", min_impressions=2), horizon_ms=120 * MINUTE, bucket_ms=10 * MINUTE,
                         max_rank=5, session_ms=5 * MINUTE, interval_ms=10 * MINUTE, dedup_ms=10 * MINUTE)


def click_events(events: int = 400, seed: int = 3) -> list[Impression | Click]:
    spec = SimulationSpec(events=events, seed=seed, queries=8, rate=0.2, clicks=True)
    parsed = (parse_event(value) for _, value in Simulator(spec).messages())
    return [e for e in parsed if isinstance(e, Impression | Click)]


class JudgeStoreContract:
    @pytest.fixture
    def store(self) -> JudgeStore:
        raise NotImplementedError("a subclass provides the store under contract")

    def test_a_judge_committed_batch_by_batch_is_loaded_as_it_was(self, store: JudgeStore) -> None:
        store.adopt()
        epoch = store.claim("t:0")
        judge = ClickJudge(SETTINGS)
        events = click_events()
        offset = None
        decided = 0
        for start in range(0, len(events), 37):
            for event in events[start:start + 37]:
                decided += len(judge.add(event))
            store.commit([JudgeCommit("t:0", epoch, judge.changes(), start + 37, offset)])
            offset = start + 37
            loaded = store.load("t:0")
            assert loaded.offset == offset
            assert judge_format.fields_of_state(loaded.state) == judge_format.fields_of_state(judge.state())
        assert decided and judge.stats.forget_before(0) is False
        assert store.statuses(["t:0", "t:1"]) == {"t:0": Status(judge.clock_ms, judge.closed),
                                                  "t:1": Status(None, None)}
        assert store.figures()["t:0"]["offset"] == str(offset)

    def test_a_stale_epoch_or_offset_writes_nothing(self, store: JudgeStore) -> None:
        first = store.claim("t:0")
        judge = ClickJudge(SETTINGS)
        for event in click_events(60):
            judge.add(event)
        store.commit([JudgeCommit("t:0", first, judge.changes(), 5, None, outbox=[b'{"a": 1}'])])
        second = store.claim("t:0")
        with pytest.raises(FencedError, match="newer holder"):
            store.commit([JudgeCommit("t:0", first, judge.changes(), 9, 5)])
        with pytest.raises(FencedError, match="expected offset"):
            store.commit([JudgeCommit("t:0", second, judge.changes(), 9, 7)])
        with pytest.raises(FencedError):
            store.published("t:0", first, 1)
        assert store.load("t:0").offset == 5
        assert store.load("t:0").outbox == [b'{"a": 1}']

    def test_the_outbox_keeps_what_was_decided_until_it_is_published(self, store: JudgeStore) -> None:
        epoch = store.claim("t:0")
        empty = ClickJudge(SETTINGS).changes()
        store.commit([JudgeCommit("t:0", epoch, empty, 1, None, outbox=[b"1", b"2"])])
        store.commit([JudgeCommit("t:0", epoch, empty, 2, 1, outbox=[b"3"])])
        assert store.load("t:0").outbox == [b"1", b"2", b"3"]
        store.published("t:0", epoch, 2)
        assert store.load("t:0").outbox == [b"3"]
        store.published("t:0", epoch, 1)
        assert store.load("t:0").outbox == []

    def test_the_rank_counts_of_a_closed_boundary_are_kept_until_pruned(self, store: JudgeStore) -> None:
        epochs = {p: store.claim(p) for p in ("t:0", "t:1")}
        empty = ClickJudge(SETTINGS).changes()
        store.commit([JudgeCommit("t:0", epochs["t:0"], empty, 1, None, closed_ranks=(600, [[3, 2], [1, 0]])),
                      JudgeCommit("t:1", epochs["t:1"], empty, 1, None, closed_ranks=(600, [[1, 1], [1, 1]]))])
        store.commit([JudgeCommit("t:0", epochs["t:0"], empty, 2, 1, closed_ranks=(1200, [[4, 2], [1, 0]]),
                                  prune_before=1200)])
        assert store.closed_ranks(["t:0", "t:1", "t:2"], 600) == {"t:0": None, "t:1": [[1, 1], [1, 1]], "t:2": None}
        assert store.closed_ranks(["t:0"], 1200) == {"t:0": [[4, 2], [1, 0]]}

    def test_figures_are_kept_with_each_partition(self, store: JudgeStore) -> None:
        epoch = store.claim("t:3")
        store.commit([JudgeCommit("t:3", epoch, ClickJudge(SETTINGS).changes(), 1, None,
                                  figures={"grades": '{"1.0": 2}'})])
        assert store.figures()["t:3"]["grades"] == '{"1.0": 2}'

    def test_each_graded_pair_reads_back_as_its_last_judgment_published(self, store: JudgeStore) -> None:
        assert store.recorded_format() is None and store.partitions() == []
        store.adopt()
        assert store.recorded_format() == str(judge_format.JUDGE_FORMAT_VERSION)
        epoch = store.claim("t:0")
        judge = ClickJudge(SETTINGS)
        last: dict[tuple[str, str], dict[str, object]] = {}
        for start, event in enumerate(click_events()):
            for judgment in judge.add(event):
                last[(judgment.query_id, judgment.doc_id)] = judgment.message()
            store.commit([JudgeCommit("t:0", epoch, judge.changes(), start + 1, start or None)])
        current = {pair: m for pair, m in last.items() if m["grade"] is not None}
        assert current
        assert store.partitions() == ["t:0"]
        assert {pair: {"grade": g.grade, "ts": g.ts, "evidence": g.evidence}
                for pair, g in store.graded("t:0").items()} == \
            {pair: {"grade": m["grade"], "ts": m["ts"], "evidence": m["evidence"]} for pair, m in current.items()}
        some = sorted(current)[:2]
        assert set(store.graded("t:0", [*some, ("no such query", "d")])) == set(some)
        assert store.graded("t:9") == {} and store.graded("t:0", []) == {}
