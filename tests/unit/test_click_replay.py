"""`stream-ndcg replay --click-model`: judgments decided from clicks and scored with, as a user runs it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stream_ndcg.cli import main
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay

# The hand-worked example of test_click_models, as a file: its clicks, its traps, one rater's
# judgment (set aside), and a search at 01:00 that passes the first boundary.
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clicks.jsonl"
BOUNDARY = 1_763_686_800_000
FLAGS = ["--click-min-impressions", "4", "--click-max-rank", "3", "--k", "3"]


def test_coec_judgments_are_written_and_scored_with(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "judgments.jsonl"
    assert main(["replay", str(EXAMPLE), "--click-model", "coec", *FLAGS, "--judgments-out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(j["doc_id"], j["grade"], j["evidence"]) for j in written] == [
        ("a", 3.0, {"impressions": 4, "clicks": 3, "expected_clicks": 1.5}),
        ("b", 0.0, {"impressions": 4, "clicks": 0, "expected_clicks": 1.25}),
        ("c", 1.0, {"impressions": 4, "clicks": 1, "expected_clicks": 1.25})]
    assert {(j["type"], j["ts"], j["event_id"], j["source"]) for j in written} == {
        ("judgment", BOUNDARY, f"coec@{BOUNDARY}", "coec")}
    # Scored with a 3, b 0, c 1 (the rater's 3 for b set aside), exponential gains 7, 0, 1, pool ideal
    # a, c, b: IDCG@3 = 7 + 1/log2(3). i1 (a b c): 7 + 1/2; i2 (b a c): 7/log2(3) + 1/2; i3 (a c b): the
    # ideal; i4 (c a b): 1 + 7/log2(3). Query r's two searches have no judgment and no nDCG.
    ideal = 7 + 1 / math.log2(3)
    expected = (7.5 + (7 / math.log2(3) + 0.5) + ideal + (1 + 7 / math.log2(3))) / ideal / 4
    assert summary["k"]["3"]["ndcg_mean"] == pytest.approx(expected, abs=1e-12)
    assert summary["k"]["3"]["scored_impressions"] == 4
    judged = summary["click_judgments"]
    assert (judged["boundaries"], judged["judgments"], judged["set_aside"]) == (1, 3, 1)
    assert judged["graded"] == {"0": 1, "1": 1, "3": 1}
    assert judged["events"]["rejected:unknown_impression"] == 1
    # Every click is counted as the service counts it, valid or not for the click model.
    assert summary["events"]["click"] == 10


def test_sdbn_scores_as_grades(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "judgments.jsonl"
    assert main(["replay", str(EXAMPLE), "--click-model", "sdbn", *FLAGS, "--click-grade", "score",
                 "--judgments-out", str(out)]) == 0
    capsys.readouterr()
    assert {j["doc_id"]: j["grade"] for j in map(json.loads, out.read_text().splitlines())} == {
        "a": 0.4, "b": 0.125, "c": 0.267}


def test_the_replay_scores_with_the_judgments_it_decided(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --click-model the replay scores as a plain replay of the same impressions with the
    judgments it wrote does: they are applied as any judgment event is."""
    out = tmp_path / "judgments.jsonl"
    assert main(["replay", str(EXAMPLE), "--click-model", "coec", *FLAGS, "--judgments-out", str(out)]) == 0
    with_clicks = json.loads(capsys.readouterr().out)
    plain = Replay(Measure(cutoffs=(3,)))
    for line in EXAMPLE.read_bytes().splitlines() + out.read_bytes().splitlines():
        if b'"rater-1"' not in line:
            plain.add(line)
    assert plain.summary()["k"] == with_clicks["k"]


def test_click_flags_need_a_click_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(EXAMPLE), "--click-horizon", "7d"]) == 2
    assert "--click-horizon only applies with --click-model" in capsys.readouterr().err
    assert main(["replay", str(EXAMPLE), "--click-model", "coec", "--click-thresholds", "2,1,0"]) == 2
    assert "--click-thresholds" in capsys.readouterr().err


def test_a_file_shorter_than_the_judge_interval_decides_nothing_and_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(EXAMPLE), "--click-model", "coec", "--judge-interval", "1d"]) == 0
    captured = capsys.readouterr()
    assert "passed no --judge-interval boundary (1d)" in captured.err
    assert json.loads(captured.out)["k"]["10"]["scored_impressions"] == 0


def test_the_history_takes_the_judgments_from_clicks_when_they_are_decided(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    om = tmp_path / "history.om"
    assert main(["replay", str(EXAMPLE), "--click-model", "coec", *FLAGS, "--openmetrics", str(om),
                 "--windows", "1d"]) == 0
    summary = json.loads(capsys.readouterr().out)
    samples = [line.split() for line in om.read_text().splitlines() if line.startswith("stream_ndcg_ndcg{")]
    # No judgment (the rater's is set aside) until the boundary's, published after the search that passed it.
    assert [value for _, value, _ in samples[:-1]] == ["NaN"] * (len(samples) - 1)
    assert float(samples[-1][1]) == pytest.approx(summary["k"]["3"]["ndcg_mean"], abs=1e-12)
