"""The drill-down's figures over queries (query-clustered standard errors, query-averaged means,
query counts), brought up to date at most once per interval and served from the last computation
in between.

Standard library only. Bringing them up to date reads every row the engine logged since the last
time, decodes it and moves the per-query sums (`drilldown.explorer.Explorer.query_figures`): under
load that doubles a scrape, and it holds the interpreter lock against the consumer loop. A scrape
of /metrics and the API's summary read `latest` instead; a refresher thread (`start`) brings the
figures up to date every interval, so that neither waits for it. The means, sums and
impression-level errors stay as fresh as every scrape: they come from the window sums, not from here.

    figures = PeriodicQueryFigures(explorer.query_figures, windows_end, interval_s=5.0)
    figures.latest(now_ms, {300_000: [("A",), ("B",)]})   # nothing held yet: computed at once
    figures.latest(now_ms, {300_000: [("A",)]})           # within 5 s: the same computation
    figures.start()                                        # computed again every 5 s, in a thread
    figures.stop()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from stream_ndcg.errors import StoreUnavailable

logger = logging.getLogger(__name__)

# How long `stop` waits for a computation under way (a Redis read that waits for its timeout):
# the thread is a daemon, and a shutdown does not wait longer for figures nobody will read.
STOP_WAIT_S = 10.0

# The share of the interpreter a refresh takes at most, in slices of at most REFRESH_SLICE_S of
# work with sleeps between them. A refresh holds the interpreter lock while it works, so unpaced it
# runs as a burst at every interval (the rows of a whole interval put into the index at once) and
# the consumer loop shares the lock with it throughout; paced, the loop waits at most a slice.
REFRESH_SHARE = 0.25
REFRESH_SLICE_S = 0.005


class Pacer:
    """Called between steps of some work: sleeps after each `slice_s` of it, so that the work
    takes at most `share` of the time; a no-op on any thread but the one it paces."""

    def __init__(self, share: float = REFRESH_SHARE, slice_s: float = REFRESH_SLICE_S,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"a share of {share}")
        self.slice_s, self.clock, self.sleep = slice_s, clock, sleep
        self.rest_s = slice_s * (1 - share) / share
        self.thread_id: int | None = None
        self._slice_began = 0.0

    def pace(self, thread_id: int | None) -> None:
        """Pace the thread `thread_id` (None: none) from now on."""
        self.thread_id, self._slice_began = thread_id, self.clock()

    def __call__(self) -> None:
        if self.thread_id is None or threading.get_ident() != self.thread_id:
            return
        if self.clock() - self._slice_began >= self.slice_s:
            self.sleep(self.rest_s)
            self._slice_began = self.clock()


# Per window and segment values, per cut-off, the figures over the window's queries.
Figures = dict[int, dict[tuple[str, ...], list[dict[str, float | None]]]]
Wanted = Mapping[int, Iterable[tuple[str, ...]]]
QueryFigures = Callable[[int, Wanted], Figures]


@dataclass(frozen=True)
class Computed:
    """One computation of the figures: for which windows and segment values, where the windows
    ended (`now_ms`, the windows' clock) and when it was taken (`at_s`, by the wall clock)."""

    figures: Figures
    wanted: dict[int, frozenset[tuple[str, ...]]]
    now_ms: int
    at_s: float

    def covers(self, wanted: Mapping[int, frozenset[tuple[str, ...]]]) -> bool:
        return all(window in self.wanted and values <= self.wanted[window] for window, values in wanted.items())


class PeriodicQueryFigures:
    """The figures of `compute`, computed again when `latest` finds them older than `interval_s`
    (0: on every call) or by a refresher thread every `interval_s`; safe to call from several threads.

    `windows_end` gives where the windows end for a refresh (None before any event). `compute`
    calls `pacer` between its steps: the refresher thread's computations are paced by it, a
    scrape's or a request's are not.
    """

    def __init__(self, compute: QueryFigures, windows_end: Callable[[], int | None], interval_s: float,
                 clock: Callable[[], float] = time.time, pacer: Pacer | None = None) -> None:
        if interval_s < 0:
            raise ValueError(f"an interval of {interval_s} s")
        self.compute, self.windows_end, self.interval_s, self.clock = compute, windows_end, interval_s, clock
        self.pacer = pacer or Pacer()
        self._last: Computed | None = None
        # Every window and segment values asked for so far: each computation computes them all (a
        # value that leaves the windows stays; segment_cap bounds them).
        self._asked: dict[int, set[tuple[str, ...]]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self, now_ms: int, wanted: Wanted) -> Computed:
        """The last computation if it has every window and segment values `wanted` names and,
        unless a refresher is running, is younger than the interval; else one computed now, the
        windows ending at `now_ms`."""
        asked = {window: frozenset(values) for window, values in wanted.items()}
        with self._lock:
            for window, values in asked.items():
                self._asked.setdefault(window, set()).update(values)
            last = self._last
        if last is not None and last.covers(asked) and (self.refreshing() or not self._aged(last)):
            return last
        return self._computed(now_ms)

    def refresh(self) -> Computed | None:
        """Compute the figures again, for every window and segment values asked for so far, the
        windows ending now; None before anything was asked or any event applied."""
        now_ms = self.windows_end()
        with self._lock:
            if now_ms is None or not self._asked:
                return None
        return self._computed(now_ms)

    def _aged(self, last: Computed) -> bool:
        age = self.clock() - last.at_s
        # A wall clock set back makes the age negative: computed again rather than held until it catches up.
        return age >= self.interval_s or age < 0

    def _computed(self, now_ms: int) -> Computed:
        with self._lock:
            wanted = {window: frozenset(values) for window, values in self._asked.items()}
        at_s = self.clock()
        computed = Computed(self.compute(now_ms, wanted), wanted, now_ms, at_s)
        with self._lock:
            # Two computations at once (a scrape asking for a new segment value while the refresher
            # runs): the one taken later is kept.
            if self._last is None or self._last.at_s <= at_s:
                self._last = computed
        return computed

    def start(self) -> None:
        """Bring the figures up to date every interval in a daemon thread, until `stop`."""
        if self.interval_s <= 0 or self.refreshing():
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="query-figures", daemon=True)
        self._thread.start()

    def refreshing(self) -> bool:
        """Whether a refresher thread is running (a scrape then never waits for a computation it holds)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop the refresher, waiting up to STOP_WAIT_S for a computation under way to end."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_WAIT_S)
            self._thread = None

    def _run(self) -> None:
        self.pacer.pace(threading.get_ident())
        while not self._stopping.wait(self.interval_s):
            try:
                self.refresh()
            except StoreUnavailable as exc:
                # The last computation is served meanwhile; its age shows in the figures' timestamp.
                logger.warning("query figures not brought up to date: %s", exc)
