"""Changing the metric configuration: the classification, the in-memory store adopting in place, and exactness."""

from __future__ import annotations

import math
from typing import Any

import pytest

from stream_ndcg.config import Settings
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.engine import Engine
from stream_ndcg.errors import ConfigError
from stream_ndcg.events import Impression
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay
from stream_ndcg.pipeline import BatchPipeline
from stream_ndcg.reconfigure import classify, configured, report
from stream_ndcg.segments import SegmentProjector
from stream_ndcg.state.format import FORMAT_VERSION
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.vocabulary import segment_values
from stream_ndcg.windows import window_means
from tests.support.batches import parsed


def recorded(**flags: str) -> dict[str, object]:
    return configured(Settings.load(flags={"k": "5,10", "windows": "5m,1h", "grace": "10m", **flags}))


STORED = recorded()


@pytest.mark.parametrize("flags", [{"k": "10,5"}, {"windows": "1h,5m"}, {"windows": "300s,60m"},
                                   {"windows": "300000,3600000"}, {"k": " 10 , 5 "}])
def test_a_configuration_spelled_another_way_is_the_same(flags: dict[str, str]) -> None:
    assert classify(STORED, recorded(**flags)).kind == "same"


def test_segment_labels_are_a_set() -> None:
    assert classify(recorded(segment_labels="variant,engine"),
                    recorded(segment_labels="engine,variant")).kind == "same"


def test_state_recorded_before_the_history_was_is_the_same_with_its_own_settings() -> None:
    old = {name: value for name, value in STORED.items() if name not in ("horizon", "history")}
    assert classify(old, STORED).kind == "same"


@pytest.mark.parametrize(("flags", "change"), [
    ({"k": "10"}, "k: 5 no longer reported"),
    ({"k": "5"}, "k: 10 no longer reported"),
    ({"windows": "5m,30m,1h"}, "windows: 30m added (the state keeps 70m of history)"),
    ({"windows": "5m,1h", "grace": "20m"}, "history: up to 80m kept from now on; the state holds 70m so far"),
    ({"windows": "70m"}, "windows: 70m added"),
    ({"windows": "1h"}, "windows: 5m no longer reported"),
    ({"windows": "5m"}, "history: 15m kept instead of 70m"),
])
def test_a_change_the_state_can_serve_is_compatible(flags: dict[str, str], change: str) -> None:
    verdict = classify(STORED, recorded(**flags))
    assert verdict.kind == "compatible", verdict
    assert any(line.startswith(change) for line in verdict.changes), verdict.changes


def test_dropping_a_segment_label_is_compatible() -> None:
    verdict = classify(recorded(segment_labels="variant,engine"), recorded(segment_labels="variant"))
    assert verdict.kind == "compatible"
    assert verdict.changes == ("segment_labels: engine no longer reported (its series fold together)",)


def test_the_history_recorded_after_a_change_is_what_the_state_holds() -> None:
    longer = classify(STORED, recorded(grace="1d")).record
    assert longer["horizon"] == 3_600_000 + 86_400_000 and longer["history"] == 4_200_000
    # The grown horizon holds only what the state held: a window beyond needs a rebuild.
    assert classify(longer, recorded(grace="1d", windows="5m,1h,2h")).kind == "rebuild"
    shorter = classify(STORED, recorded(windows="5m")).record
    assert shorter["history"] == 900_000
    assert classify(shorter, recorded(windows="5m,10m")).kind == "compatible"
    assert classify(shorter, recorded(windows="5m,1h")).kind == "rebuild"


@pytest.mark.parametrize(("flags", "reason"), [
    ({"k": "5,10,20"}, "k: 20 is deeper than the 10 ranks the state keeps of each list"),
    ({"k": "3,5,10"}, "k: 3 is new, and the state holds no sums for it"),
    ({"gain": "linear"}, "gain: state built with 'exponential', configured 'linear'"),
    ({"ideal": "list"}, "ideal: state built with 'pool', configured 'list'"),
    ({"bucket": "5m"}, "bucket: state built with 1m buckets, configured 5m"),
    ({"windows": "5m,1h,2h"}, "windows: 2h is longer than the 70m of history the state keeps"),
    ({"segment_labels": "variant,engine"}, "segment_labels: engine is new"),
])
def test_a_change_that_needs_data_the_state_lacks_needs_a_rebuild(flags: dict[str, str], reason: str) -> None:
    verdict = classify(STORED, recorded(**flags))
    assert verdict.kind == "rebuild"
    assert any(line.startswith(reason) for line in verdict.reasons), verdict.reasons
    assert reason.split(":")[0] in verdict.refusal() and "rebuild=true" in verdict.refusal()


def test_with_the_list_ideal_the_deepest_cutoff_is_part_of_every_ndcg() -> None:
    stored = recorded(ideal="list")
    assert classify(stored, recorded(ideal="list", k="10")).kind == "compatible"
    verdict = classify(stored, recorded(ideal="list", k="5"))
    assert verdict.kind == "rebuild"
    assert verdict.reasons[0].startswith("k: with ideal 'list' the deepest cut-off")


def test_the_report_says_which_case_applies() -> None:
    assert report(None, STORED, rebuild=False) == ("no stored state: the first start records this configuration",
                                                   True)
    text, starts = report(STORED, recorded(k="10", windows="5m,30m,1h"), rebuild=False)
    assert starts and "windows=5m,1h" in text and "applying in place" in text and "30m added" in text
    text, starts = report(STORED, recorded(k="5,10,20"), rebuild=False)
    assert not starts and "k: 20 is deeper" in text and "exits 2" in text
    assert report(STORED, recorded(k="5,10,20"), rebuild=True)[1]


def test_the_memory_store_applies_a_compatible_change_in_place_and_refuses_the_rest() -> None:
    store = MemoryStore()
    assert store.adopt(STORED) is False
    engine = Engine(Measure(cutoffs=(5, 10)), 60_000)
    events = parsed([v for _, v in Simulator(SimulationSpec(events=200, seed=3, queries=10)).messages()])
    BatchPipeline(store, engine, event_clock=True).apply("t:0", store.claim("t:0"), events, 200, None)
    before = store.aggregates()
    changed = recorded(k="10", windows="1h,30m")
    assert store.adopt(changed) is False
    assert store.recorded_config() == (dict(changed, history=4_200_000), str(FORMAT_VERSION))
    assert store.aggregates() == before and store.next_offset("t:0") == 200
    with pytest.raises(ConfigError, match="k: 5 is new"):
        store.adopt(STORED)
    assert store.recorded_config()[0] == dict(changed, history=4_200_000)
    assert store.adopt(STORED, rebuild=True) is True
    assert not store.aggregates() and store.next_offset("t:0") is None


def replayed(messages: list[bytes], cutoffs: tuple[int, ...]) -> dict[str, Any]:
    replay = Replay(Measure(cutoffs=cutoffs))
    for value in messages:
        replay.add(value)
    by_variant: dict[str, Any] = replay.summary()["by_segment"]["variant"]
    return by_variant


def test_a_change_applied_in_place_gives_the_numbers_of_a_replay_with_the_new_configuration() -> None:
    """Half the traffic with k=5,10 split by variant and engine, the rest with k=5 by variant:
    the sums of the state, split by variant, are the replay's with k=5 to 1e-9."""
    spec = SimulationSpec(events=3_000, seed=5, queries=60, rate=50.0, engines=("bm25", "dense"))
    messages = [v for _, v in Simulator(spec).messages()]
    store = MemoryStore()
    halves = [((5, 10), ("variant", "engine"), messages[:1_500]), ((5,), ("variant",), messages[1_500:])]
    offset = None
    for cutoffs, labels, part in halves:
        store.adopt(configured(Settings.load(flags={"k": ",".join(map(str, cutoffs)), "windows": "1d",
                                                    "segment_labels": ",".join(labels)})))
        pipeline = BatchPipeline(store, Engine(Measure(cutoffs=cutoffs), 60_000), event_clock=True)
        projector = SegmentProjector(store, labels, 20)
        events = [projector.project(e) if isinstance(e, Impression) else e for e in parsed(part)]
        pipeline.apply("t:0", store.claim("t:0"), events, (offset or 0) + len(part), offset)
        offset = (offset or 0) + len(part)
    expected = replayed(messages, (5,))
    compared = 0
    for variant, by_k in expected.items():
        sums = {key: value for key, value in store.aggregates().items()
                if segment_values(key[1], ("variant",)) == [variant]}
        row = window_means(sums, (5,))["5"]
        for name in ("ndcg_mean", "dcg_mean", "judged_ratio"):
            want, got = by_k["5"][name], row[name]
            assert got == pytest.approx(want, abs=1e-9) if want is not None else got is None
            compared += 1
        assert row["scored_impressions"] == by_k["5"]["scored_impressions"]
        assert row["impressions"] == by_k["5"]["impressions"]
    assert compared == 6 and not any(math.isnan(v) for v in store.aggregates().values())

