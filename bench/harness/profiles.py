"""A cProfile of a service's loop run in the bench's process, as shares of the loop's time: by
step (the cumulative time of the functions that make a step), by whose code it is, and the
functions of most own time; and those figures as lines of a results section.

    profiler = cProfile.Profile()
    profiler.enable(); ...; profiler.disable()
    figures = shares(profiler, {("stream_ndcg.source.kafka", "poll"): "poll Kafka"})
    rows += markdown("judge's loop", figures)
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
from collections.abc import Mapping
from typing import Any

# Functions reported, by their own time.
TOP = 12


def area(path: str) -> str:
    """Whose code a profiled function is: a module of stream_ndcg, kafka-python, redis-py, C
    built-ins (sockets, locks, JSON), or the rest of the standard library."""
    if path == "~":
        return "built-ins"
    parts = path.split(os.sep)
    for package, name in (("stream_ndcg", None), ("kafka", "kafka-python"), ("redis", "redis-py")):
        if package in parts:
            return name or ".".join(parts[parts.index(package):]).removesuffix(".py")
    return "standard library"


def shares(profiler: cProfile.Profile, steps: Mapping[tuple[str, str], str]) -> dict[str, Any]:
    """The profile's figures: `steps` maps (module as `area` names it, function) to a step's name."""
    entries = pstats.Stats(profiler, stream=io.StringIO()).stats  # type: ignore[attr-defined]
    loop = sum(own for (_, _, own, _, _) in entries.values())
    areas: dict[str, float] = {}
    by_step: dict[str, float] = {}
    for (path, _, name), (_, _, own, cumulative, _) in entries.items():
        areas[area(path)] = areas.get(area(path), 0.0) + own / loop
        step = steps.get((area(path), name))
        if step is not None:
            by_step[step] = by_step.get(step, 0.0) + cumulative / loop
    ranked = sorted(entries.items(), key=lambda item: -item[1][2])[:TOP]
    return {"steps": {step: round(by_step.get(step, 0.0), 3) for step in steps.values()},
            "areas": {name: round(share, 3) for name, share in sorted(areas.items(), key=lambda kv: -kv[1])},
            "top": [{"function": f"{os.path.basename(path)}:{line}({name})", "own_share": round(own / loop, 3),
                     "cumulative_share": round(cumulative / loop, 3), "calls": calls}
                    for (path, line, name), (_, calls, own, cumulative, _) in ranked]}


def markdown(what: str, figures: Mapping[str, Any]) -> list[str]:
    """A profile's figures as lines of a section, `what` naming the loop and the run."""
    return [
        f"cProfile of {what}, as shares of the loop's time. Steps of the loop (their cumulative time): "
        + ", ".join(f"{step} {share}" for step, share in figures["steps"].items()) + ". Own time by whose code "
        "it is: " + ", ".join(f"{name} {share}" for name, share in figures["areas"].items() if share >= 0.01)
        + f" (the rest under 0.01 each). The {TOP} functions of most own time:",
        "",
        "| function | own | cumulative | calls |",
        "|---|---:|---:|---:|",
        *[f"| `{row['function']}` | {row['own_share']} | {row['cumulative_share']} | {row['calls']:,} |"
          for row in figures["top"]],
        "",
    ]
