"""`stream-ndcg judgments export` on the in-memory judge store: the hand-worked example of
test_click_models, committed as `judge` commits it, comes out as the judgments it published, and
as qrels that pytrec_eval reads."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import pytrec_eval

from stream_ndcg import wiring
from stream_ndcg.cli import main
from stream_ndcg.click_judge import ClickJudge
from stream_ndcg.errors import ConfigError, StoreUnavailable
from stream_ndcg.judgments_export import NoJudgeState, current, qrels_id, relevance
from stream_ndcg.state.judge_store import JudgeCommit, MemoryJudgeStore
from tests.unit.test_click_models import HOUR, T0, example, impression, judge

BOUNDARY = T0 + HOUR


def judged_store(model: str = "coec", grade: str = "thresholds",
                 partition: str = "events:0") -> tuple[MemoryJudgeStore, list[dict[str, object]]]:
    """The example through a judge committed event by event to `partition`, and what it published."""
    store = MemoryJudgeStore()
    store.adopt()
    epoch = store.claim(partition)
    click_judge: ClickJudge = judge(model, grade=grade)
    published = []
    for offset, event in enumerate([*example(), impression("k", BOUNDARY, ("x",), query="r")]):
        decided = [j.message() for j in click_judge.add(event)]
        published += decided
        store.commit([JudgeCommit(partition, epoch, click_judge.changes(), offset + 1, offset or None,
                                  outbox=[orjson.dumps(m) for m in decided])])
    return store, published


def test_the_export_is_what_the_judge_published_last_per_pair() -> None:
    store, published = judged_store()
    assert current(store, "coec") == published
    # The worked example: query r's one pair has 1 impression of the 4 required, and is not graded.
    assert [(j["doc_id"], j["grade"], j["evidence"]) for j in published] == [
        ("a", 3.0, {"impressions": 4, "clicks": 3, "expected_clicks": 1.5}),
        ("b", 0.0, {"impressions": 4, "clicks": 0, "expected_clicks": 1.25}),
        ("c", 1.0, {"impressions": 4, "clicks": 1, "expected_clicks": 1.25})]
    assert {j["event_id"] for j in published} == {f"coec@{BOUNDARY}"}


def test_the_cli_writes_jsonl_and_qrels_that_pytrec_eval_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    store, published = judged_store()
    monkeypatch.setattr(wiring, "judge_store", lambda settings: store)
    assert main(["judgments", "export", "--output", str(tmp_path / "c.jsonl")]) == 0
    assert [orjson.loads(line) for line in (tmp_path / "c.jsonl").read_bytes().splitlines()] == published
    assert main(["judgments", "export", "--format", "qrels"]) == 0
    out, err = capsys.readouterr()
    assert out == "q 0 a 3\nq 0 b 0\nq 0 c 1\n" and "3 judgment(s) of coec" in err
    qrels = pytrec_eval.parse_qrel(out.splitlines())
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut_3"})
    scores = evaluator.evaluate({"q": {"c": 3.0, "a": 2.0, "b": 1.0}})
    # trec_eval gains are the grades: DCG 1/log2(2) + 3/log2(3) + 0, ideal 3/log2(2) + 1/log2(3).
    assert scores["q"]["ndcg_cut_3"] == pytest.approx((1 + 3 / 1.584962500721156) / (3 + 1 / 1.584962500721156))


def test_score_grades_are_rounded_for_qrels_and_ids_percent_encoded() -> None:
    store, _ = judged_store(grade="score")
    assert [(j["doc_id"], j["grade"], relevance(j["grade"])) for j in current(store, "coec")] == [
        ("a", 2.0, 2), ("b", 0.0, 0), ("c", 0.8, 1)]
    assert [relevance(g) for g in (0.5, 1.499, 2.5, 0.0)] == [1, 1, 3, 0]
    assert qrels_id("red shoes\t100%") == "red%20shoes%09100%25" and qrels_id("café") == "café"


def test_wrong_input_is_said_plainly(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    store, _ = judged_store(model="sdbn")
    with pytest.raises(ConfigError, match="holds sdbn judgments and click_model is coec"):
        current(store, "coec")
    monkeypatch.setattr(wiring, "judge_store", lambda settings: store)
    assert main(["judgments", "export"]) == 2
    assert "configuration error: the judge's state holds sdbn" in capsys.readouterr().err
    with pytest.raises(NoJudgeState):
        current(MemoryJudgeStore(), "coec")
    monkeypatch.setattr(wiring, "judge_store", lambda settings: MemoryJudgeStore())
    assert main(["judgments", "export", "--namespace", "elsewhere"]) == 1
    assert "no judge state under namespace 'elsewhere'" in capsys.readouterr().err

    class Down(MemoryJudgeStore):
        def recorded_format(self) -> str | None:
            raise StoreUnavailable("Redis judge format read failed: ConnectionError: refused")

    monkeypatch.setattr(wiring, "judge_store", lambda settings: Down())
    assert main(["judgments", "export"]) == 1
    assert "cannot read the judge's state: Redis judge format read failed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["judgments", "export", "--format", "trec"])
    assert exited.value.code == 2 and "invalid choice: 'trec'" in capsys.readouterr().err
