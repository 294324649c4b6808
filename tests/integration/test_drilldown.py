"""The drill-down API of a running service (real Kafka, real Redis) against `stream-ndcg replay
--per-query` on the same events, value by value to 1e-9; its CLI twin; and its security: token,
headers, hostile ids, no query in the logs, fuzzed parameters."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.drilldown import index
from stream_ndcg.rows import add_into, row_fields
from tests.support.drilldown import query_table
from tests.support.service import Service, service_environment, wait_for_messages
from tests.support.topics import create_topic

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

TOKEN = "drill-Token-0815"
HOSTILE = "<script>window.pwned=1</script>"
CUTOFFS = (5, 10)
# (API parameters, the windows they compare) for the value-by-value check.
QUESTIONS = [
    {"window": "1m"},
    {"window": "5m", "k": "5", "sort": "impressions", "order": "desc"},
    {"window": "5m", "segment.variant": "B", "vs": "variant:A"},
    {"window": "5m", "vs": "previous", "sort": "change_ndcg"},
]


def traffic() -> list[tuple[bytes, bytes]]:
    spec = SimulationSpec(events=5_000, seed=31, queries=120, rate=8.0, max_delay_ms=300_000)
    messages = list(Simulator(spec).messages())
    # A query id a page must show, never run: an impression the service accepts like any other.
    last_ts = max(json.loads(value)["ts"] for _, value in messages[-50:])
    hostile = {"type": "impression", "impression_id": "hostile-1", "query_id": HOSTILE, "ts": last_ts,
               "results": ["<img src=x onerror=window.pwned=1>", "d2"], "segment": {"variant": "B"}}
    return [*messages, (HOSTILE.encode(), json.dumps(hostile).encode())]


@pytest.fixture(scope="module")
def running(kafka: KafkaBroker, redis_server: RedisServer,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two services over one topic, the pool ideal (behind a token) and the list ideal."""
    workdir = tmp_path_factory.mktemp("drilldown")
    topic = create_topic(kafka.bootstrap, partitions=3)
    messages = traffic()
    produce(kafka.bootstrap, topic, messages)
    events = workdir / "events.jsonl"
    events.write_bytes(b"".join(value + b"\n" for _, value in messages))
    started = {}
    for ideal, extra in (("pool", {"STREAM_NDCG_API_TOKEN": TOKEN}), ("list", {})):
        env = service_environment(kafka.bootstrap, redis_server.url, STREAM_NDCG_TOPICS=topic,
                                  STREAM_NDCG_WINDOWS="1m,5m", STREAM_NDCG_K="5,10", STREAM_NDCG_IDEAL=ideal,
                                  **extra)
        service = Service(env, workdir)
        service.start()
        started[ideal] = service
    try:
        for service in started.values():
            wait_for_messages(service, len(messages))
        yield {"services": started, "events": events, "workdir": workdir, "messages": len(messages)}
    finally:
        for service in started.values():
            if service.running():
                service.stop()


def per_query(events: Path, ideal: str, out: Path) -> dict[str, dict[tuple[str, str], list[float]]]:
    """`replay --per-query` of the events: per window, the rows by (segment key, query)."""
    subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "replay", str(events), "--k", "5,10", "--ideal", ideal,
                    "--per-query", str(out), "--windows", "1m,5m,10m", "--bucket", "1m"],
                   check=True, capture_output=True)
    fields = row_fields(CUTOFFS)
    rows: dict[str, dict[tuple[str, str], list[float]]] = {}
    for line in out.read_text().splitlines():
        record = json.loads(line)
        key = (json.dumps(record["segment"], sort_keys=True, separators=(",", ":")), record["query_id"])
        rows.setdefault(record["window"], {})[key] = [record["sums"][name] for name in fields]
    return rows


def close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def expected(rows: dict[str, dict[tuple[str, str], list[float]]], params: dict[str, str]) -> dict[str, Any]:
    """The replay's records for one question: the 10m rows less the 5m ones are the previous 5m."""
    window = params["window"]
    segment = {k.removeprefix("segment."): v for k, v in params.items() if k.startswith("segment.")}
    table = query_table(rows[window], segment)
    other = None
    if params.get("vs") == "previous":
        other = query_table(rows["10m"], segment)
        for query_id, row in table.items():
            add_into(other.setdefault(query_id, [0.0] * len(row)), row, -1.0)
        other = {q: row for q, row in other.items() if row[0] > 0}
    elif params.get("vs"):
        label, value = params["vs"].split(":")
        other = query_table(rows[window], {**segment, label: value})
    at = CUTOFFS.index(int(params.get("k", "10")))
    _, records = index.page(table, other, at, min_impressions=1, sort=params.get("sort", "ndcg"),
                                descending=params.get("order") == "desc", offset=0, limit=len(table))
    return {r["query_id"]: r for r in records}


@pytest.mark.parametrize("ideal", ["pool", "list"])
def test_the_api_equals_the_replay_per_query(running: dict[str, Any], ideal: str) -> None:
    service = running["services"][ideal]
    token = TOKEN if ideal == "pool" else ""
    rows = per_query(running["events"], ideal, running["workdir"] / f"per-query-{ideal}.jsonl")
    compared = 0
    for params in QUESTIONS:
        status, answer = service.api(f"/api/v1/queries?{urlencode({**params, 'limit': '1000'})}", token)
        assert status == 200, answer
        want = expected(rows, params)
        assert answer["total"] == len(answer["queries"]) == len(want) > 10
        for record in answer["queries"]:
            theirs = want[record["query_id"]]
            for name in index.FIGURES:
                assert close(record[name], theirs[name]), (params, record["query_id"], name)
            for name in index.COMPARED:
                assert close((record["change"] or {}).get(name), (theirs["change"] or {}).get(name)), (params, name)
                compared += 1
        # The replay's records in the order the API promises (dicts keep the order `page` gave).
        assert [r["query_id"] for r in answer["queries"]] == list(want)
    assert compared > 100


def test_the_summary_has_the_gauges_numbers(running: dict[str, Any]) -> None:
    service = running["services"]["list"]
    samples = service.scrape()
    status, summary = service.api("/api/v1/summary?window=5m")
    assert status == 200
    for row in summary["rows"]:
        labels = (("k", "10"), ("variant", row["segment"]["variant"]), ("window", "5m"))
        assert close(row["k"]["10"]["ndcg_mean"], samples[("stream_ndcg_ndcg", labels)])


def test_the_judging_queue_cli_gives_the_api_rows(running: dict[str, Any]) -> None:
    service = running["services"]["pool"]
    status, csv_text = service.api("/api/v1/judging-queue?window=5m&k=10&limit=40&format=csv", TOKEN)
    assert status == 200
    lines = csv_text.splitlines()
    assert lines[0] == "query_id,doc_id,exposure,share,best_rank,query_impressions,query_judged_ratio"
    assert len(lines) == 41
    cli = subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "judging-queue", "--window", "5m", "--top-k", "10",
                          "--limit", "40"], env={**service.env_for_tools(), "STREAM_NDCG_API_TOKEN": ""},
                         capture_output=True, text=True, check=True)
    # The same rows; a figure to 1e-9, as the API moves its window sums by what changed (so
    # 0.976 may be 0.9760000000000001) where the command reads the rows whole.
    given = [line.split(",") for line in cli.stdout.splitlines()]
    served = [line.split(",") for line in lines]
    assert given[0] == served[0] and len(given) == len(served)
    for cli_row, api_row in zip(given[1:], served[1:], strict=True):
        assert cli_row[:2] == api_row[:2]
        assert all(close(float(a) if a else None, float(b) if b else None)
                   for a, b in zip(cli_row[2:], api_row[2:], strict=True)), (cli_row, api_row)
    status, answer = service.api("/api/v1/judging-queue?window=5m&limit=40", TOKEN)
    exposures = [pair["exposure"] for pair in answer["pairs"]]
    assert exposures == sorted(exposures, reverse=True) and exposures[0] > 0
    wrong = subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "judging-queue", "--window", "2h"],
                           env=service.env_for_tools(), capture_output=True, text=True)
    assert wrong.returncode == 2
    assert "--window: '2h' is not a configured window (1m, 5m)" in wrong.stderr


def test_every_api_route_needs_the_token_and_no_answer_is_cached(running: dict[str, Any]) -> None:
    service = running["services"]["pool"]
    for path in ("/api/v1/summary", "/api/v1/queries", "/api/v1/judging-queue", f"/api/v1/queries/{quote('q1')}"):
        assert service.api(path)[0] == 401
        assert service.api(path, "not-the-token")[0] == 401
        assert service.api(path, TOKEN)[0] in (200, 404)
    headers = service.headers("/api/v1/summary", TOKEN)
    assert headers["Cache-Control"] == "no-store"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert service.headers("/api/v1/summary")["WWW-Authenticate"].startswith("Bearer")


def test_a_hostile_query_id_is_data_and_no_query_reaches_the_logs(running: dict[str, Any]) -> None:
    service = running["services"]["pool"]
    status, detail = service.api(f"/api/v1/queries/{quote(HOSTILE, safe='')}?window=5m", TOKEN)
    assert status == 200, detail
    assert detail["query_id"] == HOSTILE
    assert detail["lists"][0]["results"][0]["doc_id"] == "<img src=x onerror=window.pwned=1>"
    assert service.api(f"/api/v1/queries/{'q' * 600}", TOKEN)[1]["error"].startswith("query_id: ")
    assert service.api("/api/v1/queries/nobody-asked-this", TOKEN)[0] == 404
    logs = service.logs()
    assert "drill-down API and page on http://127.0.0.1:" in logs
    assert HOSTILE not in logs and "nobody-asked-this" not in logs and "window=5m" not in logs
    assert TOKEN not in logs


NAMES = st.sampled_from(["window", "k", "sort", "order", "limit", "offset", "min_impressions", "vs", "format",
                         "segment.variant", "segment.x", "bogus"])
VALUES = st.one_of(st.sampled_from(["1m", "5m", "10", "5", "-1", "0", "ndcg", "change_dcg", "desc", "previous",
                                    "variant:A", "B", "csv", "1e9", "", "%00", "9" * 30]),
                   st.text(max_size=40))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(params=st.lists(st.tuples(NAMES, VALUES), max_size=6),
       route=st.sampled_from(["/api/v1/summary", "/api/v1/queries", "/api/v1/judging-queue", "/api/v1/queries/q1"]))
def test_fuzzed_parameters_get_an_answer_or_a_named_refusal(running: dict[str, Any], params: list[tuple[str, str]],
                                                            route: str) -> None:
    service = running["services"]["list"]
    status, body = service.api(f"{route}?{urlencode(params)}")
    assert status in (200, 400, 404), (status, body)
    if status != 200:
        named = body["error"].split(":", 1)[0]
        assert named in {name for name, _ in params} | {"query_id", "window", "query"}, body
