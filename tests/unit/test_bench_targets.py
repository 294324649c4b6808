"""The table of issue #30's targets: each target's figure found in what its bench recorded, held to
its bound in its direction, and shown as missing, never made up, when no bench recorded it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import targets
from bench.harness.results import figures_file, publish, recorded, sections
from bench.targets import TARGETS, Direction, Target

SERVICE: dict[str, Any] = {
    "bench": "service",
    "throughput": {"events": 500000, "ratio": 0.142, "cpu_ratio": 3.0, "drilldown_ratio": 0.95,
                   "scale_cpu_ratio": 1.005, "two_instances_partitions": [2, 2],
                   "two_instances_spread_evenly": True},
    "memory": {"impressions_held": 891452, "impressions_held_small": 114857, "redis_bytes_per_impression": 310,
               "rss_ratio": 1.571},
}

STATE: dict[str, Any] = {
    "bench": "state",
    "service": {"bytes_per_impression": 108.3, "impressions": 220356},
    "sparse": {"bytes_per_impression": 300.2, "impressions": 320000},
}

LATENCY: dict[str, Any] = {
    "bench": "latency",
    "sustained": {"events_per_s": 2000},
    "latency": {"error": "probe 3 not visible after 30 s: the service fell behind the load"},
}


MEMORY: dict[str, Any] = {
    "bench": "memory",
    "memory": {"impressions_held": 1101658, "impressions_held_small": 110211, "rss_ratio": 1.107},
}


def entries(**results: dict[str, Any]) -> dict[str, Any]:
    return {name: {"command": f"python -m bench.{name}_bench", "date": "now", "result": result}
            for name, result in results.items()}


def lines(text: str) -> dict[str, str]:
    """The table's lines by target name."""
    return {line.split(" | ")[0].removeprefix("| "): line for line in text.splitlines() if line.startswith("| ")}


@pytest.mark.parametrize(("direction", "figure", "met"), [
    (Direction.AT_LEAST, 0.5, True), (Direction.AT_LEAST, 0.49, False),
    (Direction.AT_MOST, 3.0, True), (Direction.AT_MOST, 3.01, False),
    (Direction.UNDER, 149.9, True), (Direction.UNDER, 150.0, False),
])
def test_a_bound_is_held_in_its_direction_its_edge_included_unless_strict(direction: Direction, figure: float,
                                                                           met: bool) -> None:
    bound = {Direction.AT_LEAST: 0.5, Direction.AT_MOST: 3.0, Direction.UNDER: 150.0}[direction]
    assert Target("t", "b", ("x",), "", direction, bound).met(figure) is met


def test_a_figure_is_found_by_keys_and_indexes_and_only_numbers_count() -> None:
    target = Target("t", "b", ("runs", 1, "rate"), "", Direction.AT_LEAST, 1)
    assert target.measured({"runs": [{"rate": 1}, {"rate": 2.5}]}) == 2.5
    assert target.measured({"runs": [{"rate": 1}]}) is None
    assert target.measured({"runs": {"rate": 2}}) is None
    assert target.measured({"runs": [{}, {"rate": "fast"}]}) is None
    assert target.measured({"runs": [{}, {"rate": True}]}) is None
    assert target.measured({}) is None


def test_every_target_is_declared_once_with_the_issues_bound() -> None:
    names = [target.name for target in TARGETS]
    assert len(names) == len(set(names))
    bounds = {(target.direction, target.bound) for target in TARGETS}
    assert {(Direction.AT_LEAST, 0.5), (Direction.AT_MOST, 3), (Direction.AT_MOST, 150), (Direction.AT_MOST, 300),
            (Direction.AT_MOST, 1.2), (Direction.UNDER, 150), (Direction.AT_LEAST, 0.9), (Direction.AT_MOST, 5),
            (Direction.AT_MOST, 1.1)} == bounds


def test_the_table_shows_measured_target_and_met_per_line() -> None:
    table = lines(targets.section(entries(service=SERVICE, memory=MEMORY, state=STATE,
                                          replay={"bench": "replay", "events": 300000,
                                                  "replay_time_over_pytrec_eval_time": 4.97})))
    assert table["service throughput"].startswith("| service throughput | 0.142 | >= 0.5 | no | "
                                                  "`python -m bench.service_bench`, now; 500000 events |")
    assert "| 3 | <= 3 | yes |" in table["service CPU per event"]
    # Redis's bytes from the state bench, not from the service bench's memory phase.
    assert table["Redis per impression, service workload"].startswith(
        "| Redis per impression, service workload | 108.3 bytes | <= 150 bytes | yes | `python -m bench.state_bench`, "
        "now; 220356 impressions held |")
    assert "| 300.2 bytes | <= 300 bytes | no |" in table["Redis per impression, sparse workload"]
    # The service's RSS from the memory bench, not from the service bench's memory phase.
    assert table["service RSS, 10x the impressions held"].startswith(
        "| service RSS, 10x the impressions held | 1.107 | <= 1.2 | yes | `python -m bench.memory_bench`, now; "
        "1101658 vs 110211 impressions |")
    assert "| 4.97 | <= 5 | yes |" in table["replay vs pytrec_eval"]
    assert "| 1.005 | <= 1.1 | yes |" in table["scale-out, CPU per event"]
    measured = {**LATENCY, "latency": {"p99_ms": 151.0, "probes": 200, "load_events_per_s": 1000}}
    latency = lines(targets.section(entries(latency=measured)))["judgment-to-metric p99"]
    assert latency.startswith("| judgment-to-metric p99 | 151 ms | < 150 ms | no | `python -m bench.latency_bench`")
    assert "200 probes at 1000 events/s, half the sustained 2000" in latency
    assert "partitions per instance [2, 2] at the end, spread evenly from the start of the count: True" \
        in table["scale-out, CPU per event"]


def test_a_figure_not_recorded_is_missing_with_the_reason_never_filled_in() -> None:
    text = targets.section(entries(service=SERVICE, latency=LATENCY))
    table = lines(text)
    # The bench ran, but the phase failed: its error is the reason.
    assert table["judgment-to-metric p99"].startswith("| judgment-to-metric p99 | missing | < 150 ms | - | ")
    assert "fell behind the load" in table["judgment-to-metric p99"]
    # The bench did not run at all.
    assert table["replay vs pytrec_eval"] == ("| replay vs pytrec_eval | missing | <= 5 | - "
                                              "| no run of `replay` recorded |")
    assert "Met: 3 of 9; not measured: 5." in text
    nothing = targets.section({})
    assert "Met: 0 of 9; not measured: 9." in nothing
    assert all("| missing |" in line for name, line in lines(nothing).items() if name in {t.name for t in TARGETS})


def test_what_a_figure_was_measured_on_is_left_out_where_the_result_lacks_it() -> None:
    target = Target("t", "b", ("x",), "", Direction.AT_LEAST, 1, on="{throughput[events]} events")
    assert target.describe({"throughput": {"events": 5}}) == "5 events"
    assert target.describe({"x": 1}) == ""
    assert Target("t", "b", ("x",), "", Direction.AT_LEAST, 1, on="plain").describe({}) == "plain"


def test_benches_record_their_results_beside_the_file_and_the_targets_section_reads_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "RESULTS.md"
    monkeypatch.setattr(sys, "argv", ["/somewhere/bench/service_bench.py", "--events", "1000"])
    publish(results, "## Service\n\nfigures\n", SERVICE)
    publish(results, "## Replay throughput\n\nfigures\n", {"bench": "replay", "replay_time_over_pytrec_eval_time": 6})
    # A second run of a bench replaces its entry and leaves the others.
    publish(results, "## Service\n\nfigures\n", {**SERVICE, "throughput": {**SERVICE["throughput"], "ratio": 0.6}})
    assert figures_file(results) == tmp_path / "RESULTS.json"
    entries_now = recorded(results)
    assert sorted(entries_now) == ["replay", "service"]
    assert entries_now["service"]["command"] == "python -m bench.service_bench --events 1000"
    assert entries_now["service"]["result"]["throughput"]["ratio"] == 0.6
    monkeypatch.setattr(sys, "argv", ["bench/targets.py", "--results", str(results)])
    assert targets.main() == 0
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert printed["targets"]["service throughput"] == 0.6
    found = {section.heading: section for section in sections(results.read_text())}
    assert "| service throughput | 0.6 | >= 0.5 | yes |" in found[targets.HEADING].generated
    # The table records no figures of its own.
    assert sorted(recorded(results)) == ["replay", "service"]
