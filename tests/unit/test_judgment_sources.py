"""Judgment sources side by side (#28): the first listed source with a grade gives a document's
grade; other sources' judgments are counted and set aside; the setting, its rebuild, its
counters and the drill-down's view of it."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stream_ndcg.cli import main
from stream_ndcg.config import Settings
from stream_ndcg.drilldown.explorer import Explorer
from stream_ndcg.drilldown.question import Question
from stream_ndcg.engine import Engine
from stream_ndcg.errors import ConfigError
from stream_ndcg.exporter import WindowView
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay
from stream_ndcg.reconfigure import classify, configured, describe
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.vocabulary import UNLISTED_SOURCE, judgment_from
from tests.support.batches import apply_batch, parsed
from tests.support.exporter import MINUTE, T0, build, event, feed

ORDER = ("raters", "coec", "sdbn")


def judgment(doc: str, grade: float | None, minute: int, source: str | None = None, **more: Any) -> bytes:
    fields: dict[str, Any] = {"type": "judgment", "query_id": "q", "doc_id": doc, "grade": grade,
                              "ts": T0 + minute * MINUTE, **more}
    if source is not None:
        fields["source"] = source
    return event(**fields)


def impression(name: str, minute: int, results: list[str]) -> bytes:
    return event(type="impression", impression_id=name, query_id="q", ts=T0 + minute * MINUTE, results=results)


def applied(messages: list[bytes], sources: tuple[str, ...] = ORDER) -> tuple[MemoryStore, Engine]:
    store, engine = MemoryStore(bucket_ms=MINUTE), Engine(Measure(cutoffs=(3,), sources=sources), MINUTE)
    apply_batch(store, engine, "t:0", parsed(messages), epoch=store.claim("t:0"), next_offset=len(messages),
                event_clock=True)
    return store, engine


def grades(store: MemoryStore, sources: tuple[str, ...] = ORDER) -> dict[str, float]:
    return store.load("t:0", ["q"], {}).states["q"].grades(sources)


def test_a_click_model_fills_the_gaps_of_raters_and_never_overrides_them() -> None:
    store, _ = applied([judgment("a", 1, 0), judgment("a", 3, 1, "coec"), judgment("b", 2, 1, "coec"),
                        judgment("b", 0, 2, "sdbn"), judgment("c", 1, 2, "sdbn")])
    assert grades(store) == {"a": 1.0, "b": 2.0, "c": 1.0}
    # Ordered so, the click model comes first.
    assert grades(store, ("coec", "raters")) == {"a": 3.0, "b": 2.0}


def test_a_retraction_removes_its_own_sources_grade_only_and_the_next_fills_in() -> None:
    store, _ = applied([judgment("a", 1, 0), judgment("a", 3, 1, "coec"), judgment("a", None, 2),
                        judgment("b", 2, 0), judgment("b", None, 1, "coec")])
    assert grades(store) == {"a": 3.0, "b": 2.0}
    # Latest first within a source, whatever the arrival order: the rater's later grade wins back.
    store, _ = applied([judgment("a", 2, 5), judgment("a", None, 2), judgment("a", 3, 1, "coec"),
                        judgment("a", 1, 0)])
    assert grades(store) == {"a": 2.0}


def test_a_late_judgment_of_a_source_rescores_past_impressions() -> None:
    early = [impression("i1", 0, ["a", "b"]), impression("i2", 1, ["b", "a"])]
    late = [judgment("a", 3, 9, "coec"), judgment("b", 0, 9)]
    store, _ = applied(early + late)
    replay = Replay(Measure(cutoffs=(3,)))
    for message in early + late:
        replay.add(message)
    assert replay.grades("q") == grades(store) == {"a": 3.0, "b": 0.0}
    sums = store.aggregates()
    assert sum(v for (_, _, name), v in sums.items() if name == "scored@3") == 2


def test_a_judgment_of_an_unlisted_source_is_counted_and_moves_nothing() -> None:
    stream = [impression("i1", 0, ["a"]), judgment("a", 2, 0)]
    without, _ = applied(stream, ("raters",))
    # Late enough that it would move the event clock, and grading a document the state lacks.
    store, _ = applied([*stream, judgment("a", 3, 50, "coec"), judgment("z", 1, 60, "ugc")], ("raters",))
    assert store.counts() == without.counts() + Counter({UNLISTED_SOURCE: 2})
    assert store.clock_ms() == without.clock_ms()
    assert store.load("t:0", ["q"], {}).states["q"].revisions == without.load("t:0", ["q"], {}).states["q"].revisions
    assert store.counts()[judgment_from("raters")] == 1


def test_duplicates_are_found_within_a_source() -> None:
    store, _ = applied([judgment("a", 2, 0, event_id="e"), judgment("a", 2, 0, "coec", event_id="e"),
                        judgment("a", 2, 0, "coec", event_id="e")])
    counts = store.counts()
    assert (counts["judgment"], counts["duplicate:judgment"]) == (2, 1)
    assert (counts[judgment_from("raters")], counts[judgment_from("coec")]) == (1, 1)


def test_the_setting_reads_an_ordered_list_of_source_names() -> None:
    assert Settings().judgment_sources == ORDER
    assert Settings.load(flags={"judgment_sources": " coec , raters "}).measure.sources == ("coec", "raters")
    assert Settings.load(environ={"STREAM_NDCG_JUDGMENT_SOURCES": "sdbn"}).judgment_sources == ("sdbn",)
    for bad, problem in (("", "at least one"), ("raters,Raters", "not a judgment source name"),
                         ("raters,raters", "names a source twice"), ("click model", "not a judgment source")):
        with pytest.raises(ConfigError, match=f"setting judgment_sources .*{problem}"):
            Settings.load(flags={"judgment_sources": bad})


def test_changing_the_sources_or_their_order_needs_a_rebuild() -> None:
    stored = configured(Settings())
    for changed in ("coec,raters,sdbn", "raters,coec", "raters,coec,sdbn,ugc"):
        verdict = classify(stored, configured(Settings.load(flags={"judgment_sources": changed})))
        assert verdict.kind == "rebuild"
        assert "judgment_sources: state built with raters,coec,sdbn, configured " + changed in verdict.refusal()
        assert "rebuild=true" in verdict.refusal()
    # State recorded before the setting existed holds raters' grades only: the default continues it.
    before = {name: value for name, value in stored.items() if name != "judgment_sources"}
    assert classify(before, stored).kind == "same"
    assert "judgment_sources=raters,coec,sdbn" in describe(before)
    store = MemoryStore()
    store.adopt(stored)
    with pytest.raises(ConfigError, match="judgment_sources"):
        store.adopt(configured(Settings.load(flags={"judgment_sources": "coec,raters,sdbn"})))


def test_judgments_are_counted_by_source_on_metrics() -> None:
    store, engine, registry = build()
    feed(store, engine, [judgment("a", 1, 0), judgment("a", 2, 0, "coec"), judgment("b", 2, 0, "coec"),
                         judgment("c", 2, 0, "ugc")])

    def get(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"pipeline": "search", **labels})

    assert get("stream_ndcg_judgments_total", source="raters") == 1
    assert get("stream_ndcg_judgments_total", source="coec") == 2
    assert get("stream_ndcg_judgments_total", source="ugc") is None
    assert get("stream_ndcg_judgments_unlisted_source_total") == 1
    assert get("stream_ndcg_events_total", type="judgment") == 3


def test_the_drilldown_says_which_source_gave_each_grade() -> None:
    store, engine = applied([impression("i1", 0, ["a", "b", "c"]), judgment("a", 1, 0), judgment("a", 3, 0, "coec"),
                             judgment("b", 2, 0, "sdbn"), judgment("c", None, 0, "coec")])
    view = WindowView(cutoffs=(3,), windows_ms=(5 * MINUTE,), bucket_ms=MINUTE, segment_labels=(), event_clock=True)
    explorer = Explorer(store, view, engine.measure, 10 * MINUTE)
    detail = explorer.query("q", Question.parse({"window": ["5m"]}, view, "query"))
    assert [(r["doc_id"], r["grade"], r["source"]) for r in detail["lists"][0]["results"]] == [
        ("a", 1.0, "raters"), ("b", 2.0, "sdbn"), ("c", None, None)]
    assert detail["ideal_ordering"] == [
        {"doc_id": "b", "grade": 2.0, "source": "sdbn", "source_grades": {"sdbn": 2.0}},
        {"doc_id": "a", "grade": 1.0, "source": "raters", "source_grades": {"raters": 1.0, "coec": 3.0}}]
    assert {j["source"] for j in detail["judgments"]["a"]} == {"raters", "coec"}
    assert detail["judgments"]["c"] == [{"ts": T0, "event_id": None, "grade": None, "source": "coec"}]


def test_replay_takes_the_sources_as_the_service_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join([impression("i1", 0, ["a", "b"]), judgment("a", 1, 0), judgment("b", 3, 0, "coec"),
                                   judgment("a", 3, 0, "sdbn")]) + b"\n")
    # a by raters 1 and by SDBN 3, b by COEC 3; the list shows a, then b.
    for sources, unlisted, judgments, ndcg in (("raters,coec", 1, 2, (1 + 7 / math.log2(3)) / (7 + 1 / math.log2(3))),
                                               ("sdbn,coec", 1, 2, 1.0)):
        assert main(["replay", str(events), "--k", "3", "--judgment-sources", sources]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert (summary["events"][UNLISTED_SOURCE], summary["events"]["judgment"]) == (unlisted, judgments)
        assert summary["k"]["3"]["ndcg_mean"] == pytest.approx(ndcg)
