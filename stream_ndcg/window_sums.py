"""Running window sums, so that a scrape reads what changed, not every bucket of every window.

Standard library only. A scrape's exporter holds each partition's aggregate
sums per time bucket (what `StateStore.read_aggregates` gave it) and, per
window and segment values, the running total of the buckets the window
covers. A read moves the totals by the buckets it changed; a clock that moved
slides each window, taking out the buckets it lets go and adding the ones it
takes in. The totals are exact: every double is an integer multiple of
2**-1074, so each is kept as that integer, and a total moved by a month of
changes is the same number as the buckets summed afresh (rounded once, when a
mean is asked for). The means are `windows.means` of those totals, as the
replay's are. The core's other exact sums use the same whole numbers (`exact`, `rounded`), and a
short sum of doubles a pair of them that holds it exactly where it can (`fsum_of`,
`add_exactly`), at a few additions where a whole number of some 1,100 bits is an allocation.

    sums = WindowSums(windows_ms=(300_000,), bucket_ms=60_000, labels=("variant",))
    sums.apply(store.read_aggregates(sums.marks(oldest), oldest))
    sums.slide({300_000: (first, last)})
    totals = sums.totals(300_000)  # {("B",): {"impressions": 12.0, ...}}
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import frexp, fsum, ldexp
from typing import Final

from stream_ndcg.vocabulary import segment_values

# The sums of one bucket of one partition: (segment key, field) -> sum.
BucketSums = Mapping[tuple[str, str], float]
# How one is held: its keys (one tuple shared by every bucket with the same keys) and its values
# in that order, 8 bytes each: a day of minutes of 64 partitions is 92,160 of them.
_Held = tuple[tuple[tuple[str, str], ...], "array[float]"]
# Where every double sits on the integer grid: 2**-1074 is the least positive one.
# (Final: the compiled core builds them into its code rather than looking them up at each call.)
_GRID_BITS: Final = 1074
# One, in whole numbers of 2**-1074: what `rounded` divides by.
_GRID: Final = 1 << _GRID_BITS
# A double's significand, as a whole number: 53 bits.
_SIGNIFICAND: Final = 9007199254740992.0
# A whole number of 2**-1074 of at least this many bits stands for a normal double (2**52 of them is
# 2**-1022); one of fewer bits than this is within a double's range once rounded (below 2**1023).
_NORMAL_BITS: Final = 53
_DOUBLE_BITS: Final = 1023


def exact(value: float) -> int:
    """`value` as a whole number of 2**-1074: its significand as an integer (frexp's mantissa times
    2**53, exact), shifted onto the grid; a subnormal's significand ends in at least as many zero
    bits as the right shift drops. The number `float.as_integer_ratio` gives too, which costs a loop
    per bit of the fraction and a power of two as large as the denominator."""
    mantissa, exponent = frexp(value)
    shift = exponent + _GRID_BITS - 53
    significand = int(mantissa * _SIGNIFICAND)
    return significand << shift if shift >= 0 else significand >> -shift


def rounded(total: int) -> float:
    """The double nearest a whole number of 2**-1074 (int / int rounds correctly). Where that double
    is normal and the whole number within a double's range, it is the whole number rounded to a
    double (which `float` does correctly, half to even) and scaled, exactly: a division of numbers
    of some 1,100 bits costs ten times more."""
    if _NORMAL_BITS <= abs(total).bit_length() < _DOUBLE_BITS:
        return ldexp(float(total), -_GRID_BITS)
    return total / _GRID


def fsum_of(terms: list[float], count: int) -> float:
    """The first `count` terms' `fsum`: their exact sum rounded once. Found in a pair of doubles
    whose sum is the terms' exact sum (`_pair_plus`), the nearest double to which is the pair's
    first; by `fsum` itself where a pair cannot hold the sum (terms of far apart magnitudes)."""
    high = terms[0]
    low = 0.0
    for i in range(1, count):
        high, low, held = _pair_plus(high, low, terms[i])
        if not held:
            return fsum(terms[:count])
    return high


def add_exactly(highs: list[float], lows: list[float], at: int, value: float, totals: list[int]) -> None:
    """`value` added to the pair of doubles at `at` of `highs` and `lows`, whose sum stays exact
    (`_pair_plus`): where the pair cannot hold the new sum, it goes into `totals[at]` (a whole
    number of 2**-1074) and `value` starts it again. The caller adds what the pair holds in the
    end. A pair costs a few additions where a whole number of 2**-1074 (some 1,100 bits) costs an
    allocation."""
    high, low, held = _pair_plus(highs[at], lows[at], value)
    if held:
        highs[at], lows[at] = high, low
    else:
        totals[at] += exact(highs[at]) + exact(lows[at])
        highs[at], lows[at] = value, 0.0


def _pair_plus(high: float, low: float, value: float) -> tuple[float, float, bool]:
    """The pair (`high`, `low`), whose sum is exact and `high` the nearest double to it, plus
    `value`: the new pair, and whether it holds the sum exactly (if not, the pair given stands).
    Each step is Knuth's two-sum, which IEEE arithmetic makes exact."""
    # high + value = total + error, exactly.
    total = high + value
    part = total - high
    error = (high - (total - part)) + (value - part)
    # low + error = rest + lost, exactly: the pair holds the sum only if nothing is lost.
    rest = low + error
    part = rest - low
    lost = (low - (rest - part)) + (error - part)
    if lost != 0.0:
        return high, low, False
    # total + rest = the new high + low, exactly, high the nearest double to their sum.
    sum_high = total + rest
    part = sum_high - total
    return sum_high, (total - (sum_high - part)) + (rest - part), True


@dataclass
class AggregateRead:
    """What a scrape reads of one partition's aggregate sums: a store's `read_aggregates` yields them,
    `WindowSums` takes them in."""

    partition: str
    # Where the next read goes on from; None: read the partition whole next time.
    mark: str | None
    # True: `buckets` are all the partition's buckets from the `since_bucket` asked for on, so
    # forget what was held of it; False: the buckets changed since the mark (some perhaps again).
    whole: bool
    # bucket -> (segment key, field) -> sum
    buckets: dict[int, dict[tuple[str, str], float]]



class WindowSums:
    """Each window's totals per segment values, moved by bucket reads and by clock slides."""

    def __init__(self, windows_ms: Iterable[int], labels: tuple[str, ...]) -> None:
        self.labels = labels
        # bucket -> partition -> that bucket's sums
        self._held: dict[int, dict[str, _Held]] = {}
        self._layouts: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}
        self._marks: dict[str, str] = {}
        # The least bucket held: a window reaching below it needs a whole read.
        self._floor: int | None = None
        # window -> the buckets [first, last] its totals cover (none yet: absent)
        self._covered: dict[int, tuple[int, int]] = {}
        self._totals: dict[int, dict[tuple[tuple[str, ...], str], int]] = {w: {} for w in windows_ms}
        # window -> (segment values, field) -> how many held sums (of a bucket, partition and
        # segment key) add to that total: a field is reported while it has one, even a zero
        self._present: dict[int, Counter[tuple[tuple[str, ...], str]]] = {w: Counter() for w in windows_ms}
        self._values_of: dict[str, tuple[str, ...]] = {}
        self._targets: dict[tuple[tuple[str, str], ...], tuple[
            tuple[tuple[tuple[str, ...], str], ...], dict[tuple[tuple[str, ...], str], int]]] = {}

    def marks(self, since_bucket: int) -> dict[str, str]:
        """The marks to read on from, for a read of the buckets from `since_bucket` on; none (a
        whole read) if that reaches below what is held."""
        if self._floor is not None and since_bucket < self._floor:
            self._marks.clear()
        return dict(self._marks)

    def apply(self, reads: Iterable[AggregateRead], since_bucket: int) -> None:
        """Take in a read of every partition from `since_bucket` on (`StateStore.read_aggregates`),
        each partition as it comes: a read that fails part way leaves every partition taken in
        whole and its mark moved, and the others as they were."""
        listed = set()
        for read in reads:
            listed.add(read.partition)
            if read.whole:
                self._forget(read.partition)
            for bucket, sums in read.buckets.items():
                self._put(bucket, read.partition, sums)
            if read.mark is None:
                self._marks.pop(read.partition, None)
            else:
                self._marks[read.partition] = read.mark
        for partition in {p for held in self._held.values() for p in held} - listed:
            self._forget(partition)
            self._marks.pop(partition, None)
        self._floor = since_bucket

    def slide(self, ranges: Mapping[int, tuple[int, int]]) -> None:
        """Cover each window's buckets [first, last], and let go of buckets behind every window."""
        for window, (first, last) in ranges.items():
            old = self._covered.get(window)
            if old == (first, last):
                continue
            leaving = [b for b in self._held if old and old[0] <= b <= old[1] and not first <= b <= last]
            entering = [b for b in self._held if first <= b <= last and not (old and old[0] <= b <= old[1])]
            for bucket in leaving:
                for sums in self._held[bucket].values():
                    self._add(window, self._by_values(sums), -1)
            for bucket in entering:
                for sums in self._held[bucket].values():
                    self._add(window, self._by_values(sums), 1)
            self._covered[window] = (first, last)
        oldest = min(first for first, _ in ranges.values())
        for bucket in [b for b in self._held if b < oldest]:
            del self._held[bucket]

    def totals(self, window: int) -> dict[tuple[str, ...], dict[str, float]]:
        """Per segment values with something in the window: each field's total over its buckets."""
        out: dict[tuple[str, ...], dict[str, float]] = {}
        totals = self._totals[window]
        for (values, name), entries in self._present[window].items():
            if entries:
                out.setdefault(values, {})[name] = rounded(totals[(values, name)])
        return out

    def _put(self, bucket: int, partition: str, sums: BucketSums) -> None:
        held = self._held.setdefault(bucket, {})
        old = held.get(partition)
        keys = tuple(sums)
        held[partition] = (self._layouts.setdefault(keys, keys), array("d", sums.values()))
        covering = [w for w, (first, last) in self._covered.items() if first <= bucket <= last]
        if covering:
            before = self._by_values(old) if old is not None else {}
            after = self._by_values(held[partition])
            for window in covering:
                self._add(window, before, -1)
                self._add(window, after, 1)

    def _forget(self, partition: str) -> None:
        for bucket, held in self._held.items():
            old = held.pop(partition, None)
            if old is not None:
                for window, (first, last) in self._covered.items():
                    if first <= bucket <= last:
                        self._add(window, self._by_values(old), -1)

    def _add(self, window: int, grouped: Mapping[tuple[tuple[str, ...], str], tuple[int, int]], sign: int) -> None:
        totals, present = self._totals[window], self._present[window]
        for key, (entries, total) in grouped.items():
            present[key] += sign * entries
            totals[key] = totals.get(key, 0) + sign * total
            if not present[key]:
                del present[key], totals[key]

    def _by_values(self, sums: _Held) -> dict[tuple[tuple[str, ...], str], tuple[int, int]]:
        """The sums of one bucket and partition by (exported labels' values, field): how many
        segment keys add to each, and their exact total."""
        layout, values = sums
        targets, entries = self._targets_of(layout)
        totals = dict.fromkeys(entries, 0)
        # `exact`, inline: a first read runs this for millions of values.
        for target, value in zip(targets, values, strict=True):
            numerator, denominator = value.as_integer_ratio()
            totals[target] += numerator << (_GRID_BITS + 1 - denominator.bit_length())
        return {key: (entries[key], totals[key]) for key in entries}

    def _targets_of(self, layout: tuple[tuple[str, str], ...]) -> tuple[
            tuple[tuple[tuple[str, ...], str], ...], dict[tuple[tuple[str, ...], str], int]]:
        """Per position of a layout, the (labels' values, field) total it adds to; and how many
        positions add to each."""
        found = self._targets.get(layout)
        if found is None:
            targets = []
            for segment, name in layout:
                values = self._values_of.get(segment)
                if values is None:
                    values = self._values_of[segment] = tuple(segment_values(segment, self.labels))
                targets.append((values, name))
            found = self._targets[layout] = (tuple(targets), dict(Counter(targets)))
        return found
