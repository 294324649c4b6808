"""`stream-ndcg replay` end to end, as a user runs it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stream_ndcg import __version__
from stream_ndcg.cli import main
from stream_ndcg.core_build import core_build

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "events.jsonl"


def test_replay_of_the_shipped_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "per.jsonl"
    assert main(["replay", str(EXAMPLE), "--k", "6", "--gain", "linear", "--ideal", "list",
                 "--per-impression", str(out)]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["events"] == {"impression": 2, "judgment": 9, "click": 0, "judgment_unlisted_source": 0,
                                 "duplicate": 1, "rejected": {"invalid_grade": 1, "not_json": 1}}
    assert f"{EXAMPLE}:13: rejected (invalid_grade)" in captured.err
    assert f"{EXAMPLE}:14: rejected (not_json)" in captured.err
    rows = {row["impression_id"]: row for row in map(json.loads, out.read_text().splitlines())}
    # imp-1 is the seed's example: DCG 6.861, nDCG 0.961.
    assert round(rows["imp-1"]["dcg"]["6"], 3) == 6.861
    assert round(rows["imp-1"]["ndcg"]["6"], 3) == 0.961
    # imp-2: d7's judgment was retracted, leaving d4 (grade 2) at rank 2 of 3.
    assert rows["imp-2"]["judged_ratio"]["6"] == pytest.approx(1 / 6)
    assert rows["imp-1"]["segment"] == {"variant": "A"}
    assert isinstance(rows["imp-1"]["ts"], int)
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
                                  "scored_impressions": 0, "impressions": 1, "ndcg_standard_error": None,
                                  "dcg_standard_error": None, "ndcg_clustered_standard_error": None,
                                  "dcg_clustered_standard_error": None, "ndcg_query_mean": None,
                                  "dcg_query_mean": 0.0, "queries": 1}


def test_replay_rejects_bad_cutoffs(capsys: pytest.CaptureFixture[str]) -> None:
    # Checked where the setting is declared, and the message names the flag.
    assert main(["replay", str(EXAMPLE), "--k", "0"]) == 2
    err = capsys.readouterr().err
    assert "positive" in err and "--k" in err


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"stream-ndcg {__version__}, {core_build().describe()}"


IMPRESSION_LINE = b'{"type":"impression","impression_id":"i","query_id":"q","ts":1763683200000,"results":["a"]}\n'


def _replay(tmp_path: Path, content: bytes, *extra: str) -> subprocess.CompletedProcess[bytes]:
    path = tmp_path / "events.jsonl"
    path.write_bytes(content)
    return subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "replay", str(path), *extra],
                          capture_output=True, check=False)


def test_a_file_whose_every_line_is_rejected_fails_and_says_so(tmp_path: Path) -> None:
    proc = _replay(tmp_path, b"id,query,ts\n1,q,0\n\n")
    assert proc.returncode == 1
    assert (f"every line of {tmp_path / 'events.jsonl'} (2) was rejected: is it a file of events, one JSON "
            "object a line").encode() in proc.stderr
    assert json.loads(proc.stdout)["events"]["rejected"] == {"not_json": 2}
    assert _replay(tmp_path, b"not json\n" + IMPRESSION_LINE).returncode == 0


def test_a_byte_order_mark_is_named(tmp_path: Path) -> None:
    proc = _replay(tmp_path, b"\xef\xbb\xbf" + IMPRESSION_LINE + IMPRESSION_LINE.replace(b'"i"', b'"j"'))
    assert proc.returncode == 0
    assert b":1: rejected (utf8_bom): starts with a UTF-8 byte order mark (BOM)" in proc.stderr
    assert json.loads(proc.stdout)["events"]["rejected"] == {"utf8_bom": 1}


def test_times_in_epoch_seconds_get_one_warning(tmp_path: Path) -> None:
    seconds = b"".join(IMPRESSION_LINE.replace(b'"i"', f'"i{n}"'.encode()).replace(b"1763683200000", b"1763683200")
                       for n in range(3))
    proc = _replay(tmp_path, seconds)
    assert proc.returncode == 0
    assert proc.stderr.count(b"warning") == 1
    assert b"event times as small as ts=1763683200 fall before 1973 as epoch milliseconds: are they epoch " \
           b"seconds?" in proc.stderr
    assert b"warning" not in _replay(tmp_path, IMPRESSION_LINE).stderr


def test_a_missing_output_directory_fails_before_the_work(tmp_path: Path) -> None:
    target = tmp_path / "no-such-dir" / "per.jsonl"
    proc = _replay(tmp_path, IMPRESSION_LINE, "--per-impression", str(target))
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert f"cannot write --per-impression {target}: directory {target.parent} does not exist".encode() in proc.stderr


def test_a_closed_pipe_ends_the_replay_quietly(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(IMPRESSION_LINE)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone, as `head` goes after its line
    try:
        proc = subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "replay", str(path)],
                              stdout=write_end, stderr=subprocess.PIPE, check=False)
    finally:
        os.close(write_end)
    assert proc.stderr == b""
    assert proc.returncode == 141


def test_replay_compares_every_value_of_the_controls_label_with_it(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    events = tmp_path / "events.jsonl"
    lines = [{"type": "judgment", "query_id": f"q{q}", "doc_id": "a", "grade": 3, "ts": 1} for q in range(3)]
    for n in range(60):
        variant = "ABC"[n % 3]
        # B shows the judged document lower down: its nDCG is lower on every query.
        results = ["x", "a"] if variant == "B" else ["a", "x"]
        lines.append({"type": "impression", "impression_id": str(n), "query_id": f"q{n % 3 if n % 2 else 0}",
                      "ts": 2 + n, "results": results, "segment": {"variant": variant}})
    events.write_text("\n".join(map(json.dumps, lines)))
    assert main(["replay", str(events), "--k", "2", "--control", "variant=A", "--alpha", "0.1", "--n-star",
                 "100"]) == 0
    comparisons = json.loads(capsys.readouterr().out)["comparisons"]
    assert comparisons["control"] == {"label": "variant", "value": "A"}
    result = comparisons["k"]["2"]
    assert (result["alpha"], result["alpha_each"], result["n_star"]) == (0.1, 0.05, 100)
    assert result["correction"].startswith("bonferroni")
    b, c = result["arms"]["B"], result["arms"]["C"]
    assert b["plain"]["difference"] == pytest.approx(1 / math.log2(3) - 1)
    assert b["plain"]["excludes_zero"] and b["stratified"]["excludes_zero"]
    assert c["plain"]["difference"] == 0.0 and not c["plain"]["excludes_zero"]
