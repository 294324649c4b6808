"""bench/RESULTS.md: one section per benchmark, rewritten by it, with an analysis by hand that the
rewrite keeps.

A section runs from its `## ` heading line to the next one. The benchmark writes all of it but
its analysis: an `### Analysis` line and what follows it, to the end of the section, are written
by hand and kept as they are whenever the benchmark rewrites the section.

    ## Scrapes

    (the figures: written by bench/scrape_bench.py, replaced on every run)

    ### Analysis

    (a few sentences by hand: what the figures say against the target; kept)

A bench ends with `publish`, which rewrites its section, records its result and prints it:

    return publish(args.results, "## Scrapes\\n\\n| figure | ... |\\n", result)

The results are recorded machine-readably beside the results file, in RESULTS.json (`figures_file`):
one entry per bench, named by its result's "bench", with the command and time of its run; a run
replaces its bench's entry and leaves the others. bench/targets.py reads them for the table of
targets, so that a target's figure is the one its bench measured, never copied by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"
HEADING = "## "
ANALYSIS = "### Analysis"
PREAMBLE = """# Benchmark results

Each `## ` section is written by its benchmark (`make bench` runs them all), which replaces it on
every run, all but its `### Analysis`: a few sentences written by hand on what the figures say
against their targets, kept as they are by the rewrite. Read the analysis again when the figures
above it move. Each bench also records its figures in RESULTS.json beside this file, from which
`python -m bench.targets` writes the Targets (issue #30) section.
"""


@dataclass(frozen=True)
class Section:
    """One section of a results file: its heading line, the text a bench writes (the heading
    included), and the analysis by hand (the `### Analysis` line on), if it has one."""

    heading: str
    generated: str
    analysis: str | None


def sections(text: str) -> list[Section]:
    """The sections of a results file, in order (the preamble before the first is left out)."""
    lines = text.splitlines(keepends=True)
    starts = [n for n, line in enumerate(lines) if line.startswith(HEADING)]
    found = []
    for start, end in zip(starts, [*starts[1:], len(lines)], strict=True):
        generated, analysis = _split(lines[start:end])
        found.append(Section(lines[start].rstrip("\n"), generated, analysis))
    return found


def write_section(path: Path, section: str) -> None:
    """Put `section` (its first line the `## ` heading) in place of the section of that heading
    in the file at `path`, keeping that section's analysis and every other line of the file as
    they are; a heading not there yet is added at the end, a file not there yet is created."""
    heading = section.split("\n", 1)[0]
    _check(heading, section)
    text = path.read_text() if path.exists() else PREAMBLE
    lines = text.splitlines(keepends=True)
    starts = [n for n, line in enumerate(lines) if line.rstrip("\n") == heading]
    if len(starts) > 1:
        raise ValueError(f"{path} has {len(starts)} sections headed {heading!r}: which one to replace?")
    if not starts:
        path.write_text(text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n")
        return
    start = starts[0]
    end = next((n for n in range(start + 1, len(lines)) if lines[n].startswith(HEADING)), len(lines))
    _, analysis = _split(lines[start:end])
    replaced = section.rstrip("\n") + "\n"
    if analysis is not None:
        replaced += "\n" + analysis.rstrip("\n") + "\n"
    if end < len(lines):
        replaced += "\n"
    path.write_text("".join(lines[:start]) + replaced + "".join(lines[end:]))


def _split(lines: list[str]) -> tuple[str, str | None]:
    """A section's lines as (generated, analysis): the analysis from its `### Analysis` line on."""
    at = next((n for n, line in enumerate(lines) if line.rstrip() == ANALYSIS), None)
    if at is None:
        return "".join(lines), None
    return "".join(lines[:at]), "".join(lines[at:])


def _check(heading: str, section: str) -> None:
    if not heading.startswith(HEADING):
        raise ValueError(f"a section starts with its {HEADING!r} heading line, not {heading!r}")
    for line in section.splitlines()[1:]:
        if line.startswith(HEADING) or line.rstrip() == ANALYSIS:
            raise ValueError(f"a generated section may not hold the line {line!r}: it would end the section "
                             "or start its analysis by hand")


def argument_parser(description: str | None, *, quick: bool = False) -> argparse.ArgumentParser:
    """A bench's flags, with the one every bench takes: where its section is written; with
    `quick`, a --quick flag too (small sizes, to check that the bench runs)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the results file whose section this bench rewrites (default: bench/RESULTS.md)")
    if quick:
        parser.add_argument("--quick", action="store_true", help="small sizes, to check that the bench runs")
    return parser


def command(bench_file: str) -> str:
    """The command line this bench was run with, as its section reports it."""
    return " ".join(["python", "-m", f"bench.{Path(bench_file).stem}", *sys.argv[1:]])


def stamp() -> str:
    """Now, as a section's header gives the time of its run."""
    return f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC}"


def figures_file(results: Path) -> Path:
    """Where the benches' results are recorded, beside the results file `results`."""
    return results.with_suffix(".json")


def recorded(results: Path) -> dict[str, Any]:
    """The entries recorded beside the results file, by bench: {"command", "date", "result"};
    none if nothing was recorded yet."""
    path = figures_file(results)
    return dict(json.loads(path.read_text())) if path.exists() else {}


def record(results: Path, result: dict[str, Any]) -> None:
    """The result of a bench (its "bench" naming it) recorded beside the results file, in place
    of that bench's previous entry."""
    entries = recorded(results)
    entries[result["bench"]] = {"command": command(sys.argv[0]), "date": stamp(), "result": result}
    figures_file(results).write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")


def publish(path: Path, section: str, result: dict[str, Any]) -> int:
    """A bench's last step: its section written to `path`, its result recorded beside it and
    printed as one JSON line; the exit status."""
    write_section(path, section)
    record(path, result)
    print(json.dumps(result))
    return 0
