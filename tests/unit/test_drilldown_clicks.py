"""The drill-down's click evidence: a query's documents with the grade, evidence and score the
judge's store holds for them, beside the raters' grades, or the reason there are none."""

from __future__ import annotations

import orjson
import pytest

from stream_ndcg.click_models import score_of_evidence
from stream_ndcg.drilldown.api import Api
from stream_ndcg.drilldown.clicks import ClickEvidence
from stream_ndcg.drilldown.explorer import Explorer
from stream_ndcg.errors import StoreUnavailable
from stream_ndcg.exporter import WindowView
from stream_ndcg.state.judge_store import MemoryJudgeStore
from tests.support.exporter import MINUTE
from tests.unit.test_judgment_sources import applied, impression, judgment
from tests.unit.test_judgments_export import BOUNDARY, judged_store

VIEW = WindowView(cutoffs=(3,), windows_ms=(5 * MINUTE,), bucket_ms=MINUTE, segment_labels=(), event_clock=True)


def query_answer(clicks: ClickEvidence | None) -> dict[str, object]:
    # Query q shows a, b, c (the judge's hand-worked example's documents); a rater graded a 1.
    store, engine = applied([impression("i1", 0, ["a", "b", "c", "d"]), judgment("a", 1, 0)])
    status, body, _ = Api(Explorer(store, VIEW, engine.measure, 10 * MINUTE, clicks=clicks)).answer(
        "/api/v1/queries/q", {"window": ["5m"]})
    assert status == 200
    answer: dict[str, object] = orjson.loads(body)
    return answer


def test_each_document_shows_its_click_grade_evidence_and_score_beside_the_raters() -> None:
    store, _ = judged_store(partition="t:0")
    clicks = query_answer(ClickEvidence(store, "ns"))["clicks"]
    assert clicks == {"available": True, "reason": None, "model": "coec", "documents": {
        "a": {"grade": 3.0, "ts": BOUNDARY, "score": 2.0, "other_grades": {"raters": 1.0},
              "evidence": {"impressions": 4, "clicks": 3, "expected_clicks": 1.5}},
        "b": {"grade": 0.0, "ts": BOUNDARY, "score": 0.0, "other_grades": {},
              "evidence": {"impressions": 4, "clicks": 0, "expected_clicks": 1.25}},
        "c": {"grade": 1.0, "ts": BOUNDARY, "score": 0.8, "other_grades": {},
              "evidence": {"impressions": 4, "clicks": 1, "expected_clicks": 1.25}}}}


def test_sdbn_scores_come_from_the_evidence_with_the_prior() -> None:
    store, _ = judged_store(model="sdbn", partition="t:0")
    clicks = query_answer(ClickEvidence(store, "ns"))["clicks"]
    assert isinstance(clicks, dict) and clicks["model"] == "sdbn"
    assert {doc: round(entry["score"], 4) for doc, entry in clicks["documents"].items()} == \
        {"a": 0.4, "b": 0.125, "c": 0.2667}
    assert score_of_evidence({"impressions": 4, "examinations": 4, "clicks": 3, "last_clicks": 2}) == pytest.approx(0.4)


class Down(MemoryJudgeStore):
    def recorded_format(self) -> str | None:
        raise StoreUnavailable("Redis judge format read failed")


class OtherFormat(MemoryJudgeStore):
    def recorded_format(self) -> str | None:
        return "9"


@pytest.mark.parametrize(("clicks", "reason"), [
    (None, "this drill-down does not read the judge's store"),
    (ClickEvidence(MemoryJudgeStore(), "ns"), "no click judge keeps its state under namespace 'ns'"),
    (ClickEvidence(Down(), "ns"), "the judge's store cannot be read now; retry"),
    (ClickEvidence(OtherFormat(), "ns"), "format version '9'"),
])
def test_without_the_judges_store_the_answer_says_why(clicks: ClickEvidence | None, reason: str) -> None:
    answer = query_answer(clicks)
    got = answer["clicks"]
    assert isinstance(got, dict) and got["available"] is False and reason in got["reason"]
    assert got["documents"] == {} and answer["ideal_ordering"]
