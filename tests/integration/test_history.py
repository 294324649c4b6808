"""History on the dashboard: a replayed day imported into a real Prometheus with promtool, and read back
at its original times, equal to the file and, at the end, to what the service reports."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from urllib.request import urlopen

import pytest

from stream_ndcg.cli import main
from stream_ndcg.devtools.ports import free_port
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.offline.history import settings_of
from tests.support.deploy import promtool
from tests.support.history import Labels, read_openmetrics, service_gauges
from tests.support.wait import wait_until

DAY_MS = 86_400_000
FLAGS = {"k": "5,10", "bucket": "5m", "windows": "15m,1h,6h", "segment_labels": "variant", "pipeline": "history"}


def api(port: int, path: str, **params: str) -> Any:
    body = urlopen(f"http://127.0.0.1:{port}/api/v1/{path}?{urlencode(params)}", timeout=30).read()  # noqa: S310
    reply = json.loads(body)
    assert reply["status"] == "success", reply
    return reply["data"]


def key_of(metric: dict[str, str]) -> tuple[str, Labels]:
    labels = dict(metric)
    return labels.pop("__name__"), tuple(sorted(labels.items()))


def same(got: float, expected: float) -> bool:
    return (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, abs=1e-9)


def test_a_replayed_day_reads_back_from_prometheus_at_its_times(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    binary = shutil.which("prometheus")
    assert binary, "the Prometheus server is needed (Debian: apt-get install prometheus); .ci/run installs it"
    # Prometheus keeps (and queries) blocks within its retention only: the day ends two hours ago.
    start_ms = int(time.time() * 1000) - DAY_MS - 2 * 3_600_000
    spec = SimulationSpec(events=12_000, seed=13, queries=200, rate=12_000 / 86_400, malformed_share=0.01,
                          max_delay_ms=1_800_000, start_ms=start_ms)
    messages = list(Simulator(spec).messages())
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(value.replace(b"\n", b" ") + b"\n" for _, value in messages))

    history = tmp_path / "history.om"
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in FLAGS.items()]
    assert main(["replay", str(events), *flags, "--openmetrics", str(history)]) == 0
    capsys.readouterr()
    samples = read_openmetrics(history.read_text())
    times = sorted({ts for _, _, ts in samples})
    # A sample at the end of every 5-minute bucket of (nearly: 1% of the messages are malformed) the day.
    assert times == list(range(times[0], times[-1] + 1, 300_000))
    assert times[-1] - times[0] > DAY_MS - 3_600_000

    data = tmp_path / "data"
    created = subprocess.run([promtool(), "tsdb", "create-blocks-from", "openmetrics", str(history), str(data)],
                             capture_output=True, text=True, check=False)
    assert created.returncode == 0, created.stderr

    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\n")
    port = free_port()
    with open(tmp_path / "prometheus.log", "wb") as log:
        prometheus = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=30d",
                                       f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
    try:
        def ready() -> bool:
            try:
                urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5).read()  # noqa: S310
                return True
            except OSError:
                return False

        wait_until(ready, 60, lambda: f"Prometheus ready\n{(tmp_path / 'prometheus.log').read_text()[-2000:]}",
                   interval=0.5)

        # Every sample of the file is in Prometheus at its own time, and nothing else.
        matrix = api(port, "query", query='{__name__=~"stream_ndcg_.+"}[2d]', time=str(times[-1] / 1000))
        stored = {(*key_of(series["metric"]), round(float(ts) * 1000)): float(value)
                  for series in matrix["result"] for ts, value in series["values"]}
        assert stored.keys() == samples.keys()
        assert all(same(stored[key], value) for key, value in samples.items())

        # An instant query at each original time gives the file's values of that time.
        by_time: dict[int, dict[tuple[str, Labels], float]] = {}
        for (name, labels, ts), value in samples.items():
            by_time.setdefault(ts, {})[(name, labels)] = value
        for ts in times:
            vector = api(port, "query", query='{__name__=~"stream_ndcg_.+"}', time=str(ts / 1000))
            got = {key_of(series["metric"]): float(series["value"][1]) for series in vector["result"]}
            assert got.keys() == by_time[ts].keys(), ts
            assert all(same(got[key], value) for key, value in by_time[ts].items()), ts

        # The last time: what the service reports after the whole day, with the same settings.
        settings = settings_of(k=(5, 10), bucket=FLAGS["bucket"], windows=FLAGS["windows"],
                               segment_labels=FLAGS["segment_labels"], pipeline=FLAGS["pipeline"])
        expected = service_gauges(messages, settings)
        assert expected.keys() == by_time[times[-1]].keys()
        vector = api(port, "query", query='{__name__=~"stream_ndcg_.+"}', time=str(times[-1] / 1000))
        last = {key_of(series["metric"]): float(series["value"][1]) for series in vector["result"]}
        assert all(same(last[key], value) for key, value in expected.items())
        assert not any(math.isnan(value) for value in expected.values())
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
