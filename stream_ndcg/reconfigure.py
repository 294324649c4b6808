"""Changing the metric configuration: which changes the stored state can serve, exactly, and which need a rebuild.

The state records the metric configuration it was built with (`configured`:
cut-offs, gain, ideal, judgment sources, bucket, windows, segment labels, and the history it
keeps). `classify` compares the recorded one with the configured one by
meaning, not spelling, and sorts the differences:

- served in place, exactly: dropping a cut-off, a window or a segment label
  (the sums of the ones kept do not change; the exporter folds segments
  together by the labels it reports); a new window no longer than the history
  the state holds; a shorter or longer horizon (a longer one only from now on);
- a rebuild, because the state lacks the data: a new cut-off (the sums are
  credited per cut-off as events arrive, so past buckets have none for it;
  one deeper than the stored ranks is not even recomputable), a change of the
  deepest cut-off with the list ideal (it decides which documents form every
  list's ideal), a new gain, ideal or bucket, a new segment label, a window
  longer than the history held; any change of the judgment sources or their order (it
  changes which grade counts for documents judged by several, and sums already credited with
  the old ones; a source added was not kept before).

Standard library only, besides the package's settings and duration format.

    >>> stored = {"k": [5, 10], "gain": "exponential", "ideal": "pool", "bucket": 60_000,
    ...           "windows": [300_000, 3_600_000], "segment_labels": ["variant"]}
    >>> classify(stored, dict(stored, k=[10, 5])).kind
    'same'
    >>> classify(stored, dict(stored, k=[10])).changes
    ('k: 5 no longer reported',)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from stream_ndcg.config import Settings
from stream_ndcg.errors import ConfigError
from stream_ndcg.setting_values import format_duration
from stream_ndcg.vocabulary import DEFAULT_JUDGMENT_SOURCES

logger = logging.getLogger(__name__)

Kind = Literal["none", "same", "compatible", "rebuild"]

# Recorded besides the settings' metric configuration: the horizon configured, and how much
# history the state is known to hold (less than the horizon after the horizon grew in place).
HORIZON = "horizon"
HISTORY = "history"
JUDGMENT_SOURCES = "judgment_sources"


def configured(settings: Settings) -> dict[str, object]:
    """What a state built with `settings` records: `Settings.metric_config` and the horizon."""
    return {**settings.metric_config, HORIZON: settings.horizon, HISTORY: settings.horizon}


@dataclass(frozen=True)
class Reconfiguration:
    """The verdict on continuing a stored state with another metric configuration."""

    kind: Kind
    # Applied in place (kind "compatible"), for people to read.
    changes: tuple[str, ...] = ()
    # Why a rebuild is needed (kind "rebuild"), each naming its setting.
    reasons: tuple[str, ...] = ()
    # What to record when the change is applied in place.
    record: dict[str, object] = field(default_factory=dict)

    def refusal(self) -> str:
        return ("the stored state cannot serve this metric configuration: " + "; ".join(self.reasons)
                + "; start once with rebuild=true to recompute from the beginning of what the topics hold, "
                "or try it as a second pipeline (another group_id and namespace) first")


def _ints(value: Any) -> set[int]:
    return {int(v) for v in value or ()}


def _sources(config: Mapping[str, Any]) -> list[str]:
    """The judgment sources of a recorded configuration: state recorded before they were is read as
    the default's (its grades are all raters')."""
    return list(config.get(JUDGMENT_SOURCES, DEFAULT_JUDGMENT_SOURCES))


def _durations(values: set[int]) -> str:
    return ",".join(format_duration(v) for v in sorted(values))


def classify(stored: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> Reconfiguration:
    """What continuing the state recorded as `stored` (None: nothing stored) with `wanted` takes."""
    if stored is None:
        return Reconfiguration("none", record=dict(wanted))
    changes: list[str] = []
    reasons: list[str] = []
    for name in ("gain", "ideal"):
        if stored.get(name) != wanted.get(name):
            reasons.append(f"{name}: state built with {stored.get(name)!r}, configured {wanted.get(name)!r}")
    held_sources, wanted_sources = _sources(stored), _sources(wanted)
    if held_sources != wanted_sources:
        reasons.append(f"judgment_sources: state built with {','.join(held_sources)}, configured "
                       f"{','.join(wanted_sources)}: the grade of a document judged by several sources, and the "
                       "sums credited with it, may change, and judgments of a source not listed were not kept")
    if stored.get("bucket") != wanted.get("bucket"):
        reasons.append(f"bucket: state built with {format_duration(int(stored['bucket']))} buckets, configured "
                       f"{format_duration(int(wanted['bucket']))}: its sums cannot be split or joined into those")

    held_k, wanted_k = _ints(stored.get("k")), _ints(wanted.get("k"))
    depth = max(held_k, default=0)
    for k in sorted(wanted_k - held_k):
        if k > depth:
            reasons.append(f"k: {k} is deeper than the {depth} ranks the state keeps of each list")
        else:
            reasons.append(f"k: {k} is new, and the state holds no sums for it (each cut-off's sums are "
                           "added as events arrive)")
    if wanted.get("ideal") == "list" == stored.get("ideal") and wanted_k and max(wanted_k) < depth:
        reasons.append(f"k: with ideal 'list' the deepest cut-off decides which documents make each list's ideal "
                       f"(state built with {depth}, configured {max(wanted_k)}): every nDCG would change meaning")
    changes += [f"k: {k} no longer reported" for k in sorted(held_k - wanted_k)]

    held_labels, wanted_labels = set(stored.get("segment_labels") or ()), set(wanted.get("segment_labels") or ())
    reasons += [f"segment_labels: {label} is new, and the state's sums are not split by it"
                for label in sorted(wanted_labels - held_labels)]
    changes += [f"segment_labels: {label} no longer reported (its series fold together)"
                for label in sorted(held_labels - wanted_labels)]

    held_windows, wanted_windows = _ints(stored.get("windows")), _ints(wanted.get("windows"))
    # State recorded before the history was: it kept at least its longest window.
    history = int(stored.get(HISTORY, max(held_windows, default=0)))
    for window in sorted(wanted_windows - held_windows):
        if window > history:
            reasons.append(f"windows: {format_duration(window)} is longer than the {format_duration(history)} "
                           "of history the state keeps")
        else:
            changes.append(f"windows: {format_duration(window)} added (the state keeps "
                           f"{format_duration(history)} of history)")
    if held_windows - wanted_windows:
        changes.append(f"windows: {_durations(held_windows - wanted_windows)} no longer reported")

    # A configuration without one (a store's own tests) keeps what the state holds.
    horizon = int(wanted.get(HORIZON, history))
    if horizon < history:
        changes.append(f"history: {format_duration(horizon)} kept instead of {format_duration(history)} (what is "
                       "older is dropped: a longer window later needs a rebuild)")
    elif HORIZON in stored and horizon > int(stored[HORIZON]):
        changes.append(f"history: up to {format_duration(horizon)} kept from now on; the state holds "
                       f"{format_duration(history)} so far, the longest window it can serve without a rebuild")

    experiment_changes, experiment_reasons = _experiments(stored, wanted)
    changes += experiment_changes
    reasons += experiment_reasons

    if reasons:
        return Reconfiguration("rebuild", tuple(changes), tuple(reasons))
    if not changes:
        return Reconfiguration("same")
    record = {**wanted, HISTORY: min(history, horizon)} if HORIZON in wanted else dict(wanted)
    return Reconfiguration("compatible", tuple(changes), record=record)


# What of an experiment its cells depend on: changed under the same name, they would hold impressions
# of two definitions. The rest (control, alpha, n_star, end) is read or applied from now on.
_EXPERIMENT_CELLS = ("start", "label", "arms")


def _experiments(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The changes of the experiments in place, and the reasons a change of one needs a rebuild."""
    held = {e["name"]: e for e in stored.get("experiments") or ()}
    given = {e["name"]: e for e in wanted.get("experiments") or ()}
    changes = [f"experiments: {name} registered (counted from its start, or, where a partition already has "
               "state, from the bucket after its clock)" for name in sorted(given.keys() - held.keys())]
    changes += [f"experiments: {name} no longer registered (its sums are no longer written or read, and expire "
                "after experiment_retention)" for name in sorted(held.keys() - given.keys())]
    reasons: list[str] = []
    for name in sorted(held.keys() & given.keys()):
        before, after = held[name], given[name]
        moved = [key for key in _EXPERIMENT_CELLS if before.get(key) != after.get(key)]
        if moved:
            reasons.append(f"experiments: {name}'s {', '.join(moved)} changed, and its sums hold the impressions "
                           "of the one registered: register the new one under another name")
        elif before != after:
            edited = sorted(key for key in after.keys() | before.keys() if before.get(key) != after.get(key))
            changes.append(f"experiments: {name}'s {', '.join(edited)} changed" + (
                " (an end counts no bucket from it on; what was counted stays)" if "end" in edited else ""))
    return changes, reasons


def decide(stored: Mapping[str, Any] | None, wanted: Mapping[str, Any], *, rebuild: bool) -> tuple[
        dict[str, object] | None, bool]:
    """What a store does at start-up: (the configuration to record, None to keep the recorded one;
    whether to start afresh). A change the state cannot serve raises ConfigError saying which
    settings need a rebuild and why, unless `rebuild`."""
    verdict = classify(stored, wanted)
    if verdict.kind == "same":
        return None, False
    if verdict.kind == "rebuild":
        if not rebuild:
            raise ConfigError(verdict.refusal())
        return dict(wanted), True
    if verdict.kind == "compatible":
        logger.warning("metric configuration changed in place: %s", "; ".join(verdict.changes))
    return verdict.record, False


def report(stored: Mapping[str, Any] | None, wanted: Mapping[str, Any], *, rebuild: bool) -> tuple[str, bool]:
    """For `check-config --state`: what a start would do with the stored state, and whether it would start."""
    verdict = classify(stored, wanted)
    if verdict.kind == "none":
        return "no stored state: the first start records this configuration", True
    lines = [f"stored state: {describe(stored or {})}"]
    if verdict.kind == "same":
        lines.append("this configuration continues it unchanged")
    elif verdict.kind == "compatible":
        lines.append("this configuration continues it, applying in place:")
        lines += [f"  - {change}" for change in verdict.changes]
    else:
        lines.append("this configuration needs a rebuild"
                     + (" (rebuild=true: the state starts afresh from the beginning of the topics):" if rebuild
                        else ", and `run` exits 2 without rebuild=true:"))
        lines += [f"  - {reason}" for reason in verdict.reasons]
    return "\n".join(lines), verdict.kind != "rebuild" or rebuild


def describe(config: Mapping[str, Any]) -> str:
    """A recorded configuration as people write it: windows and history as durations."""
    parts = [f"k={','.join(map(str, sorted(_ints(config.get('k')))))}", f"gain={config.get('gain')}",
             f"ideal={config.get('ideal')}"]
    if "bucket" in config:
        parts.append(f"bucket={format_duration(int(config['bucket']))}")
    parts.append(f"windows={_durations(_ints(config.get('windows')))}")
    parts.append(f"segment_labels={','.join(sorted(config.get('segment_labels') or ())) or '(none)'}")
    parts.append(f"judgment_sources={','.join(_sources(config))}")
    if HISTORY in config:
        parts.append(f"history={format_duration(int(config[HISTORY]))}")
    return " ".join(parts)
