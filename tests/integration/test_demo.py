"""`stream-ndcg demo`, as a newcomer runs it: the better variant ahead, by the raters' true grades
and, minutes in, by the judgments `judge` derives from the clicks too; every window filled minutes
in, and nothing left behind on Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.request import urlopen

import pytest

from stream_ndcg.devtools.ports import free_port
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


def children_of(pid: int) -> set[int]:
    found: set[int] = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) == pid:
            child = int(status.parent.name)
            found |= {child} | children_of(child)
    return found


def test_demo_shows_the_better_variant_ahead_by_grades_and_clicks_fills_every_window_and_ctrl_c_stops_everything(
        tmp_path: Path) -> None:
    port, api_port = free_port(), free_port()
    out = tmp_path / "demo.out"
    begun = time.monotonic()
    with open(out, "wb") as stream:
        demo = subprocess.Popen([sys.executable, "-m", "stream_ndcg.cli", "demo", "--metrics-port", str(port),
                                 "--api-port", str(api_port), "--rate", "400"], stdout=stream, stderr=subprocess.STDOUT)
    try:
        frame = ""

        def both_variants_scored() -> dict[str, str]:
            nonlocal frame
            frames = out.read_text(errors="replace").split("\x1b[H\x1b[2J")
            frame = frames[-1] if len(frames) > 1 else ""
            # The raters' nDCG (the first column: "nan" does not match); the clicks' comes minutes later.
            rows = dict(re.findall(r"^\s+1h\s+([AB])\s+([0-9.]+)\s", frame, re.MULTILINE))
            return rows if len(rows) == 2 else {}

        rows = wait_until(both_variants_scored, 90, lambda: f"an nDCG for both variants in the 1h window:\n{frame}",
                          interval=0.5)
        assert float(rows["A"]) > float(rows["B"]), frame
        assert f"127.0.0.1:{port}/metrics" in frame
        assert f"drill-down page: http://127.0.0.1:{api_port}/" in frame
        summary = json.loads(urlopen(f"http://127.0.0.1:{api_port}/api/v1/summary?window=1h", timeout=10).read())
        assert {row["segment"]["variant"] for row in summary["rows"]} >= {"A", "B"}
        started = children_of(demo.pid)
        assert started, "the demo started no Kafka or Redis process"
        # Minutes in, the traffic's event time keeps up with the wall clock: every window, the
        # shortest (the current minute's bucket alone) included, holds impressions of both variants.
        # Away from a minute's edge: the 1m window is the current minute's bucket alone, which
        # holds next to nothing in its first second. (Minutes in is what is tested: the wait is for the clock.)
        wait_until(lambda: time.monotonic() >= begun + 150 and 15 <= time.time() % 60 <= 55, 240,
                   "two and a half minutes in, away from a minute's edge", interval=0.5)
        frame = out.read_text(errors="replace").split("\x1b[H\x1b[2J")[-1]
        impressions = {(window, variant): float(count) for window, variant, count in re.findall(
            r"^\s+(1m|5m|1h)\s+([AB])\s+\S+\s+\S+\s+\S+\s+\S+\s+([0-9]+)\s*$", frame, re.MULTILINE)}
        assert len(impressions) == 6, frame
        assert all(count > 0 for count in impressions.values()), frame
        # The demo's experiment, B against A from the demo's start (whole buckets: from the
        # minute after it), counts both arms by now.
        demo_experiment = json.loads(urlopen(f"http://127.0.0.1:{api_port}/api/v1/experiments/demo",
                                             timeout=10).read())
        arms = next(iter(demo_experiment["k"].values()))["arms"]
        assert arms["A"]["scored_impressions"] > 0 and arms["B"]["scored_impressions"] > 0, demo_experiment
        # judge decided its first minutes' judgments from the clicks, and the clicks' pipeline
        # scored the hour with them: the better variant ahead there too.
        by_clicks = dict(re.findall(r"^\s+1h\s+([AB])\s+[0-9.]+\s+([0-9.]+)\s", frame, re.MULTILINE))
        assert len(by_clicks) == 2, frame
        assert float(by_clicks["A"]) > float(by_clicks["B"]), frame
        judged = re.search(r"judge: clicks\s+([0-9]+)\s+pairs graded\s+([0-9]+)", frame)
        assert judged is not None and int(judged[1]) > 0 and int(judged[2]) > 0, frame
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # Its Kafka and Redis too: left running, they would slow every test after this one.
            for pid in children_of(demo.pid) | {demo.pid}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            demo.wait()
            pytest.fail(f"the demo did not stop within 60 s of Ctrl-C:\n{out.read_text(errors='replace')[-3000:]}")
    assert demo.returncode == 0, out.read_text()[-2000:]
    left = [pid for pid in started if os.path.exists(f"/proc/{pid}")
            and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()]
    assert not left, f"processes left behind: {left}"
