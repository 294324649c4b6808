"""The benches' results file: a bench rewrites its own section and nothing else, and the analysis
written by hand under it survives the rewrite; the percentiles the benches report."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis

from bench.harness.figures import anatomy, memory_by_kind, percentile, timings
from bench.harness.results import ANALYSIS, PREAMBLE, RESULTS, Section, sections, write_section
from bench.harness.service_process import spread_evenly
from bench.harness.workloads import PARTITIONS

BEFORE = f"""# Benchmark results

Some words before the first section.

## Replay throughput

| events | ratio |
|---:|---:|
| 300000 | 4.97 |
## Service

| figure | measured |
|---|---:|
| throughput | 9119 events/s |

{ANALYSIS}

Throughput is bounded by the engine, one Python thread.

- a list inside the analysis

## Service levels

Another section whose heading starts like the one above.

{ANALYSIS}

Its own analysis.
"""


def test_a_rewrite_replaces_the_generated_part_and_keeps_the_analysis(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(BEFORE)
    write_section(path, "## Service\n\n| figure | measured |\n|---|---:|\n| throughput | 12000 events/s |\n")
    after = path.read_text()
    service = {s.heading: s for s in sections(after)}["## Service"]
    assert "12000 events/s" in service.generated and "9119" not in after
    assert service.analysis == (f"{ANALYSIS}\n\nThroughput is bounded by the engine, one Python thread.\n\n"
                                "- a list inside the analysis\n\n")
    # Everything before and after the section is as it was, to the byte.
    assert after.startswith(BEFORE[:BEFORE.index("## Service\n")])
    assert after.endswith(BEFORE[BEFORE.index("## Service levels"):])


def test_a_rewrite_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(BEFORE)
    section = "## Service\n\nnew figures\n"
    write_section(path, section)
    once = path.read_text()
    write_section(path, section)
    assert path.read_text() == once


def test_a_section_without_analysis_gets_none_and_leaves_the_next_ones_alone(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(BEFORE)
    write_section(path, "## Replay throughput\n\nnew figures\n")
    found = {s.heading: s for s in sections(path.read_text())}
    assert found["## Replay throughput"] == Section("## Replay throughput", "## Replay throughput\n\nnew figures\n\n",
                                                    None)
    assert found["## Service"].analysis is not None and "9119" in found["## Service"].generated
    assert found["## Service levels"].analysis == f"{ANALYSIS}\n\nIts own analysis.\n"


def test_the_heading_is_matched_whole(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(BEFORE)
    write_section(path, "## Service levels\n\nrewritten\n")
    found = {s.heading: s for s in sections(path.read_text())}
    assert found["## Service levels"].generated == "## Service levels\n\nrewritten\n\n"
    assert found["## Service levels"].analysis == f"{ANALYSIS}\n\nIts own analysis.\n"
    assert "9119 events/s" in found["## Service"].generated


def test_a_new_section_goes_at_the_end_and_a_new_file_gets_the_preamble(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(BEFORE)
    write_section(path, "## Scrapes\n\nfigures\n")
    assert path.read_text() == BEFORE + "\n## Scrapes\n\nfigures\n"
    fresh = tmp_path / "fresh.md"
    write_section(fresh, "## Scrapes\n\nfigures")
    assert fresh.read_text() == PREAMBLE + "\n## Scrapes\n\nfigures\n"


@pytest.mark.parametrize("section", [
    "Service\n\nno heading line\n",
    "## Service\n\nfigures\n\n## Another heading\n",
    f"## Service\n\nfigures\n\n{ANALYSIS}\n\nwritten by the bench\n",
])
def test_a_section_that_would_end_itself_or_claim_the_analysis_is_refused(tmp_path: Path, section: str) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(BEFORE)
    with pytest.raises(ValueError):
        write_section(path, section)
    assert path.read_text() == BEFORE


def test_a_heading_found_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(BEFORE + "\n## Service\n\nagain\n")
    with pytest.raises(ValueError, match="2 sections"):
        write_section(path, "## Service\n\nfigures\n")


def test_every_section_of_the_results_file_carries_an_analysis_and_no_diary() -> None:
    found = sections(RESULTS.read_text())
    assert found, "no sections in bench/RESULTS.md"
    for section in found:
        assert section.analysis is not None and section.analysis.strip() != ANALYSIS, section.heading
        # What the figures say now; when and in which run belongs to git.
        assert not re.search(r"\bsession \d|\d{4}-\d\d-\d\d|\d\d:\d\d UTC", section.analysis, re.IGNORECASE), \
            section.heading


def test_percentiles_are_nearest_rank() -> None:
    values = [float(n) for n in range(1, 201)]
    assert percentile(values, 99) == 198.0
    assert percentile(values[:100], 99) == 99.0
    assert percentile([5.0], 99) == 5.0
    assert timings([0.010, 0.030, 0.020]) == {"p50_ms": 20.0, "p99_ms": 30.0}
    assert timings([0.25, 0.5], unit="s", digits=3) == {"p50_s": 0.375, "p99_s": 0.5}


def test_partitions_are_spread_evenly_when_all_are_held_and_no_instance_holds_two_more() -> None:
    assert spread_evenly([PARTITIONS])
    assert spread_evenly([PARTITIONS // 2, PARTITIONS - PARTITIONS // 2])
    assert not spread_evenly([PARTITIONS, 0])
    # One instance not answering yet, or a rebalance under way (partitions held by no one).
    assert not spread_evenly([PARTITIONS, None])
    assert not spread_evenly([1, 1])


class _Pipeline:
    def __init__(self, sizes: dict[bytes, int]) -> None:
        self.sizes = sizes
        self.asked: list[bytes] = []

    def memory_usage(self, key: bytes, samples: int) -> None:
        self.asked.append(key)

    def execute(self) -> list[int]:
        return [self.sizes[key] for key in self.asked]


class _Redis:
    """The few commands the key-by-kind walk sends, over keys of one hash each."""

    def __init__(self, sizes: dict[bytes, int]) -> None:
        self.sizes = sizes

    def scan_iter(self, match: str, count: int) -> Iterator[bytes]:
        return iter([key for key in self.sizes if key.decode().startswith(match.rstrip("*"))])

    def pipeline(self, transaction: bool) -> _Pipeline:
        return _Pipeline(self.sizes)

    def config_get(self, name: str) -> dict[str, str]:
        return {name: "64"}

    def object(self, what: str, key: bytes) -> bytes:
        return b"listpack"

    def type(self, key: bytes) -> bytes:
        return b"hash"

    def hgetall(self, key: bytes) -> dict[bytes, bytes]:
        return {b"f": b"v" * 70}


def test_memory_by_kind_and_anatomy_walk_the_same_keys_summed_by_the_kind_after_the_hash_tag() -> None:
    client = _Redis({b"{svc:0}:q:query-1": 100, b"{svc:0}:q:query-2": 50, b"{svc:1}:lists:query-1": 30,
                     b"{svc:g}:counts": 7, b"{other:0}:q:query-1": 1000})
    walked = cast(redis.Redis, client)
    assert memory_by_kind(walked, "svc") == {"q": 150, "lists": 30, "counts": 7}
    taken_apart = anatomy(walked, "svc")
    assert {kind: found.used for kind, found in taken_apart.items()} == memory_by_kind(walked, "svc")
    assert taken_apart["q"].keys == 2 and taken_apart["q"].over_listpack_value == 2
    assert taken_apart["q"].encodings == {"listpack": 2}


def test_the_squares_cut_applies_to_this_trees_sources_as_a_build_without_them(tmp_path: Path) -> None:
    # The squares bench's baseline: no squares step and no moments mark (whose absence keeps the
    # groups' sums in the stored layout); a source it no longer fits stops the bench, not skews it.
    from bench.core_bench import ENGINE_CUTS, cut_squares_source

    package = Path(__file__).resolve().parents[2] / "stream_ndcg"
    for name in ("engine.py", "list_squares.py"):
        (tmp_path / name).write_text((package / name).read_text())
    cut_squares_source(tmp_path)
    engine = (tmp_path / "engine.py").read_text()
    assert "totals[MOMENTS]" not in engine and "MOMENTS not in group.credited" not in engine
    assert all(replacement in engine for replacement in ENGINE_CUTS.values())
    squares = (tmp_path / "list_squares.py").read_text()
    assert "        return {}\n" in squares and "        return None\n" in squares
    compile(engine, "engine.py", "exec")
    compile(squares, "list_squares.py", "exec")
    # Cut already: the lines the cut replaces are not there.
    with pytest.raises(SystemExit, match="has not the line the cut replaces"):
        cut_squares_source(tmp_path)
