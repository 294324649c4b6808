"""The dashboard's history: the service's window gauges at the end of every time bucket, in OpenMetrics text.

`stream-ndcg replay --openmetrics OUT` feeds the events, in the order given
(their arrival order), through the service's own path with the event clock:
`pipeline.BatchPipeline` parses, projects segments and applies them with the
`engine.Engine` to a `state.memory.MemoryStore`. Whenever the next event would move
the clock into a later bucket, the events so far are committed and the
`exporter.Exporter` is scraped over the store, and its window gauges are
recorded at the end of the bucket the clock stood in. So each sample is what
the service with ``clock=event`` reported just before that bucket ended:
impressions in each window ending then, scored with the judgments that had
arrived by then (a judgment arriving later re-scores the impressions of later
samples only, as it did live). The last sample equals what the service reports
at the end of the stream. A bucket the clock skipped (no event with a time in
it) has no sample: the service's view stood still then, and Prometheus shows a gap.

The whole input counts as one partition, read in file order; the service's
record checks apply without the key check (files carry no Kafka keys), and an
event more than ``max_future`` ahead of the wall clock at replay time is refused.

    history = History(settings_of(k=(5, 10), bucket="5m"))
    for line in lines:
        history.add(line)
    with open("history.om", "w") as out:
        history.write(out)
"""

from __future__ import annotations

import argparse
import math
import os
import re
import time
from array import array
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from prometheus_client import CollectorRegistry

from stream_ndcg import wiring
from stream_ndcg.config import Settings, flag_name
from stream_ndcg.errors import ConfigError
from stream_ndcg.events import Click, Event, InvalidEvent, Judgment
from stream_ndcg.experiments import parse_experiments
from stream_ndcg.exporter import Exporter, WindowView
from stream_ndcg.setting_flags import add_setting_flags
from stream_ndcg.source.local import LocalRecord
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.vocabulary import MetricName

# The gauges of the windows, read from the state: the dashboard's quality panels. The event
# counters and this process's own metrics are left out.
WINDOW_GAUGES = (MetricName.NDCG, MetricName.NDCG_NUMERATOR, MetricName.SCORED_IMPRESSIONS, MetricName.DCG,
                 MetricName.DCG_NUMERATOR, MetricName.JUDGED_RATIO, MetricName.JUDGED_RATIO_NUMERATOR,
                 MetricName.IMPRESSIONS)
# The one partition the input stands for, as the store names partitions.
PARTITION = "replay:0"
# Events staged before a commit at most, so that a long bucket of heavy traffic is not held
# in memory at once (the numbers do not depend on where batches end).
MAX_BATCH = 10_000
_ESCAPES = re.compile(r'[\\"\n]')


class OpenMetricsWriter:
    """Gauge samples with timestamps, written as one OpenMetrics text exposition.

    OpenMetrics wants each family's ``# HELP`` and ``# TYPE`` before its samples, each series
    (label set) of a family in one run, its samples in increasing time, and ``# EOF`` at the end;
    promtool's importer refuses a series whose time goes back. Samples are kept in arrays of
    numbers per series (16 bytes each), as they come time after time, until `write` puts them
    in that order: families and series as first added.

        writer = OpenMetricsWriter()
        writer.add("x", "An x.", {"k": "10"}, 0.5, timestamp_ms=60_000)
        writer.write(sys.stdout)    # ... x{k="10"} 0.5 60 ... # EOF
    """

    def __init__(self) -> None:
        self._help: dict[str, str] = {}
        self._series: dict[str, dict[tuple[tuple[str, str], ...], tuple[array[int], array[float]]]] = {}

    def add(self, name: str, help_text: str, labels: Mapping[str, str], value: float, timestamp_ms: int) -> None:
        if name not in self._help:
            self._help[name] = help_text
            self._series[name] = {}
        key = tuple(labels.items())
        series = self._series[name].get(key)
        if series is None:
            series = self._series[name][key] = (array("q"), array("d"))
        times, values = series
        if times and timestamp_ms <= times[-1]:
            raise ValueError(f"{name}{dict(key)}: a sample at {timestamp_ms} ms after one at {times[-1]} ms")
        times.append(timestamp_ms)
        values.append(value)

    def write(self, out: TextIO) -> None:
        for name, help_text in self._help.items():
            out.write(f"# HELP {name} {_escape(help_text)}\n# TYPE {name} gauge\n")
            for key, (times, values) in self._series[name].items():
                series = name + ("{" + ",".join(f'{label}="{_escape(v)}"' for label, v in key) + "}" if key else "")
                for timestamp_ms, value in zip(times, values, strict=True):
                    out.write(f"{series} {_value(value)} {_seconds(timestamp_ms)}\n")
        out.write("# EOF\n")


def _escape(text: str) -> str:
    return _ESCAPES.sub(lambda m: {"\\": "\\\\", '"': '\\"', "\n": "\\n"}[m.group()], text)


def _value(value: float) -> str:
    """The shortest text that reads back as the same float (repr), in OpenMetrics' spelling."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _seconds(timestamp_ms: int) -> str:
    """OpenMetrics timestamps are seconds; Prometheus keeps milliseconds, so three decimals are exact."""
    whole, ms = divmod(timestamp_ms, 1000)
    return f"{whole}.{ms:03d}" if ms else str(whole)


class History:
    """The service's window gauges at every bucket end the event clock reaches, for the events added in order.

        history = History(settings)        # settings of the service, the clock taken as "event"
        history.add(b'{"type": "impression", ...}')
        history.write(out)                 # finishes the last bucket and writes the OpenMetrics text
    """

    def __init__(self, settings: Settings, writer: OpenMetricsWriter | None = None) -> None:
        self.settings = settings
        self.writer = writer or OpenMetricsWriter()
        # Built as the service is (`wiring`), over the in-memory store.
        self.store = MemoryStore(bucket_ms=settings.bucket, horizon_ms=settings.horizon,
                                 dedup_horizon_ms=settings.dedup_horizon)
        # Without drill-down rows: a history holds the window gauges only.
        self.engine = wiring.engine(settings, drilldown=False)
        self.pipeline = wiring.batch_pipeline(settings, self.store, self.engine, require_key=False, event_clock=True)
        self.registry = CollectorRegistry()
        Exporter(self.registry, self.store, WindowView.from_settings(settings))
        self.epoch = self.store.claim(PARTITION)
        self.now_ms = int(time.time() * 1000)
        self._pending: list[Event | InvalidEvent] = []
        self._offset = 0
        self._committed: int | None = None
        # The bucket of the event clock: the greatest event time seen.
        self._clock_bucket: int | None = None
        self.samples = 0

    def add(self, raw: bytes | str) -> None:
        value = raw.encode() if isinstance(raw, str) else raw
        event = self.pipeline.parse(LocalRecord(PARTITION, 0, self._offset, None, value), self.now_ms)
        # A click, or a judgment of a source not listed, moves no clock of the service (`engine.Engine.apply`).
        if not isinstance(event, InvalidEvent | Click) and not (
                isinstance(event, Judgment) and event.source not in self.engine.measure.sources):
            bucket = self.engine.bucket_of(event.ts)
            if self._clock_bucket is None:
                self._clock_bucket = bucket
            elif bucket > self._clock_bucket:
                # This event moves the clock into a later bucket: record the one it leaves first.
                self._commit()
                self._record(self._clock_bucket)
                self._clock_bucket = bucket
        self._pending.append(event)
        self._offset += 1
        if len(self._pending) >= MAX_BATCH:
            self._commit()

    def write(self, out: TextIO) -> None:
        """Record the bucket the clock ends in and write every sample."""
        self._commit()
        if self._clock_bucket is not None:
            self._record(self._clock_bucket)
        self.writer.write(out)

    def _commit(self) -> None:
        if self._pending:
            self.pipeline.apply(PARTITION, self.epoch, self._pending, next_offset=self._offset,
                                expected_offset=self._committed)
            self._committed = self._offset
            self._pending = []

    def _record(self, clock_bucket: int) -> None:
        """Scrape the exporter over the committed state, at the end of the clock's bucket."""
        end_ms = (clock_bucket + 1) * self.settings.bucket
        for family in self.registry.collect():
            if family.name in WINDOW_GAUGES:
                for sample in family.samples:
                    self.writer.add(family.name, family.documentation, sample.labels, sample.value, end_ms)
                    self.samples += 1


def settings_of(*, k: Sequence[int] | str | None = None, gain: str | None = None, ideal: str | None = None,
                max_results: int | str | None = None, bucket: str | None = None, windows: str | None = None,
                segment_labels: str | None = None, pipeline: str | None = None,
                dedup_horizon: str | None = None, judgment_sources: str | None = None,
                control: str | None = None, alpha: str | None = None, n_star: str | None = None,
                experiments: str | None = None) -> Settings:
    """The service's settings for a history (or a replay), its defaults where a value is None;
    ConfigError if invalid."""
    flags: dict[str, Any] = {"k": k, "gain": gain, "ideal": ideal, "max_results": max_results, "bucket": bucket,
                             "windows": windows, "segment_labels": segment_labels, "namespace": pipeline,
                             "dedup_horizon": dedup_horizon, "judgment_sources": judgment_sources,
                             "control": control, "alpha": alpha, "n_star": n_star, "experiments": experiments,
                             "clock": "event"}
    return Settings.load(flags=flags)


def replay_labels(control: str | None, experiments: str | None) -> str | None:
    """The labels a replay compares by: the control's and the experiments' (it reads every label
    of the events, and the settings check that these are among them)."""
    labels = [control.partition("=")[0]] if control else []
    try:
        labels += [experiment.label for experiment in parse_experiments(experiments or "")]
    except ValueError as exc:
        raise ConfigError(f"setting experiments (from --experiments): {exc}") from None
    return ",".join(dict.fromkeys(labels)) or None


# The settings only a history reads (`--pipeline` is the namespace, the pipeline label's value).
# `--bucket` is not among them: it also sets the buckets of the dedup horizon.
_HISTORY_FLAGS = ("windows", "segment_labels", "namespace")
_FLAG_NAMES = {"namespace": "--pipeline"}
# What `replay --per-query` reads of them.
_PER_QUERY_FLAGS = ("bucket", "windows")


def add_history_flags(parser: argparse.ArgumentParser) -> None:
    """`replay`'s flags for `--openmetrics`: the service's settings the window gauges depend on."""
    group = parser.add_argument_group(
        "history for Prometheus",
        "the window gauges the service (clock=event) reported at the end of every bucket, for "
        "`promtool tsdb create-blocks-from openmetrics`; the events must be in arrival order")
    group.add_argument("--openmetrics", metavar="OUT.om", help="write the history to this file in OpenMetrics text")
    # The service's settings of the same names (`--bucket` is also the step of --dedup-horizon).
    add_setting_flags(group, ("bucket", *_HISTORY_FLAGS), variables=False, flags=_FLAG_NAMES)


def history_of(args: argparse.Namespace) -> History | None:
    """The history `replay`'s flags ask for, None without `--openmetrics`; ConfigError if the flags
    are invalid or the output's directory does not exist (before any work is done)."""
    if args.openmetrics is None:
        given = [name for name in _HISTORY_FLAGS if getattr(args, name) is not None
                 and not (args.per_query and name in _PER_QUERY_FLAGS)]
        if given:
            raise ConfigError(f"{_FLAG_NAMES.get(given[0], flag_name(given[0]))} only applies with --openmetrics")
        return None
    directory = os.path.dirname(os.path.abspath(args.openmetrics))
    if not os.path.isdir(directory):
        raise ConfigError(f"--openmetrics: directory {directory} does not exist")
    return History(settings_of(k=args.k, gain=args.gain, ideal=args.ideal, max_results=args.max_results,
                               bucket=args.bucket, windows=args.windows, segment_labels=args.segment_labels,
                               pipeline=args.namespace, dedup_horizon=args.dedup_horizon,
                               judgment_sources=args.judgment_sources))


def write_history(history: History, path: str) -> None:
    with open(path, "w", encoding="utf-8") as out:
        history.write(out)
