"""`stream-ndcg replay` end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stream_ndcg import __version__
from stream_ndcg.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "events.jsonl"


def test_replay_of_the_shipped_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "per.jsonl"
    assert main(["replay", str(EXAMPLE), "--k", "6", "--gain", "linear", "--ideal", "list",
                 "--per-impression", str(out)]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["events"] == {"impression": 2, "judgment": 9, "duplicate": 1,
                                 "rejected": {"invalid_grade": 1, "not_json": 1}}
    assert f"{EXAMPLE}:13: rejected (invalid_grade)" in captured.err
    assert f"{EXAMPLE}:14: rejected (not_json)" in captured.err
    rows = {row["impression_id"]: row for row in map(json.loads, out.read_text().splitlines())}
    # imp-1 is the seed's example: DCG 6.861, nDCG 0.961.
    assert round(rows["imp-1"]["dcg"]["6"], 3) == 6.861
    assert round(rows["imp-1"]["ndcg"]["6"], 3) == 0.961
    # imp-2: d7's judgment was retracted, leaving d4 (grade 2) at rank 2 of 3.
    assert rows["imp-2"]["judged_ratio"]["6"] == pytest.approx(1 / 6)
    assert summary["by_segment"]["variant"]["A"]["6"]["impressions"] == 1
    assert summary["k"]["6"]["scored_impressions"] == 2


def test_replay_reads_stdin_and_fails_on_an_unreadable_file(tmp_path: Path) -> None:
    line = b'{"type":"impression","impression_id":"i","query_id":"q","ts":0,"results":["a"]}\n'
    proc = subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "replay", "-", str(tmp_path / "missing.jsonl")],
                          input=line, capture_output=True, check=False)
    assert proc.returncode == 1
    assert b"cannot read" in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["k"]["10"] == {"ndcg_mean": None, "dcg_mean": 0.0, "judged_ratio": 0.0,
                                  "scored_impressions": 0, "impressions": 1}


def test_replay_rejects_bad_cutoffs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["replay", str(EXAMPLE), "--k", "0"])
    assert "positive" in capsys.readouterr().err


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"stream-ndcg {__version__}"
