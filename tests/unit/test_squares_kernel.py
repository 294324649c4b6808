"""The compiled core's C kernel of `list_squares` against the Python loops it stands for: the same
operations on two `ListSquares` give the same masks, DCGs and exact sums, to the last bit, over
gains and counts wider than the service's (subnormal and huge squares, sums that cancel, counts
past 2**32, lists 64 deep)."""

from __future__ import annotations

import importlib.util
import math
import sys
from array import array
from types import ModuleType

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stream_ndcg import core_build
from stream_ndcg.window_sums import exact
from tests.support.grades import move_grades

try:
    from stream_ndcg import squares_kernel
except ImportError:  # a pure install: no compiled core, no kernel
    squares_kernel = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(squares_kernel is None, reason="the compiled core's kernel is not built")


def _list_squares(native: bool) -> ModuleType:
    """A copy of list_squares.py run from its source, using the kernel or its own loops."""
    name = f"list_squares_{'kernel' if native else 'loops'}"
    spec = importlib.util.spec_from_file_location(name, core_build.PACKAGE_DIR / "list_squares.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    setattr(module, "_NATIVE", native)  # noqa: B010  (a module's Final, replaced on this copy alone)
    setattr(module, "squares_kernel", squares_kernel)  # noqa: B010
    return module


KERNEL, LOOPS = (_list_squares(True), _list_squares(False)) if squares_kernel is not None else (None, None)

DOCS = [f"d{n}" for n in range(12)]
GAIN = st.one_of(
    st.sampled_from([0.0, 1.0, 3.0, 7.0, 0.1]),
    st.floats(min_value=1e-200, max_value=1e100),
    st.floats(min_value=-1e3, max_value=1e3, allow_nan=False),
)
# Some documents shown as strings of their own, equal to the grades' but not the same objects (a
# list from an event the engine has not interned, beside one it has).
RANKED = st.lists(st.tuples(st.sampled_from(DOCS), st.booleans()), min_size=1, max_size=70).map(
    lambda shown: tuple("".join(list(doc)) if fresh else doc for doc, fresh in shown))
COUNT = st.one_of(st.integers(1, 3), st.integers(1, 1 << 40))
CUTOFFS = st.lists(st.integers(1, 64), min_size=1, max_size=5, unique=True).map(tuple)


def _state(squares: object) -> tuple[object, ...]:
    return tuple(getattr(squares, name) for name in ("tops", "masks", "dcgs", "counts", "totals", "found"))


@settings(max_examples=300, deadline=None)
@given(CUTOFFS, st.lists(st.tuples(st.lists(st.tuples(RANKED, COUNT), max_size=20),
                                   st.dictionaries(st.sampled_from(DOCS), st.one_of(st.none(), GAIN), max_size=4),
                                   st.booleans()),
                         min_size=1, max_size=6))
def test_the_kernel_keeps_what_the_python_loops_keep(
        cutoffs: tuple[int, ...],
        rounds: list[tuple[list[tuple[tuple[str, ...], int]], dict[str, float | None], bool]]) -> None:
    # Each round: lists taken, grades moved, and whether the lists that repeat no document are told
    # so (as the engine tells of those it knows: they are not looked at for repeats).
    assert KERNEL is not None and LOOPS is not None
    with_kernel, with_loops = KERNEL.ListSquares(), LOOPS.ListSquares()
    gains: dict[str, float] = {"d0": 1.0}
    lists: dict[tuple[str, ...], int] = {}
    for squares in (with_kernel, with_loops):
        squares.sums(lists, gains, cutoffs, set())
    for taken, moves, told in rounds:
        for ranked, count in taken:
            plain = told and len(set(ranked)) == len(ranked)
            for squares in (with_kernel, with_loops):
                squares.added(ranked, count, plain)
            lists[ranked] = lists.get(ranked, 0) + count
        before = move_grades(gains, moves)
        found = [squares.sums(lists, dict(gains), cutoffs, set(moves), before)
                 for squares in (with_kernel, with_loops)]
        assert found[0] == found[1]
        assert _state(with_kernel) == _state(with_loops)


@example([1.0, 2.0**-53, 2.0**-106])  # a tie between two doubles that only the third term breaks
@given(st.lists(st.floats(min_value=-1e150, max_value=1e150), min_size=3, max_size=64))
def test_a_dcg_of_many_terms_is_their_fsum(terms: list[float]) -> None:
    # One list whose documents' gains are the terms, at a discount of 1: its DCG at the deepest
    # cut-off is the fsum of its nonzero terms, however they cancel.
    assert squares_kernel is not None
    top = tuple(f"t{i}" for i in range(len(terms)))
    gains = dict(zip(top, terms, strict=True))
    dcgs = array("d")
    totals = [0]
    squares_kernel.score_new([top], 0, gains, (1.0,) * 64, (64,), [], dcgs, [1], totals)
    expected = math.fsum(terms)
    assert list(dcgs) == [expected]
    assert totals == [exact(expected * expected)]


def test_a_document_shown_at_two_ranks_in_one_call_is_discounted_at_each() -> None:
    # The call's table of known documents holds a gain, never a term: each rank has its discount.
    assert squares_kernel is not None
    discounts = (1.0, 0.5, 0.25)
    dcgs = array("d")
    totals = [0]
    squares_kernel.score_new([("a", "b"), ("b", "a"), ("x", "y", "a")], 0, {"a": 1.0, "b": 3.0}, discounts, (3,),
                             [], dcgs, [1, 1, 1], totals)
    assert list(dcgs) == [1.0 + 1.5, 3.0 + 0.5, 0.25]
    assert totals == [exact(2.5 * 2.5) + exact(3.5 * 3.5) + exact(0.25 * 0.25)]


def test_documents_past_the_calls_table_are_looked_up_each_time() -> None:
    # More distinct documents in one call than its table of known documents holds (512).
    assert squares_kernel is not None
    tops: list[tuple[str | None, ...]] = [(f"d{n}", "x", f"e{n}") for n in range(700)]
    gains = {**{f"d{n}": float(n % 5) for n in range(700)}, **{f"e{n}": float(n % 3) for n in range(700)}}
    dcgs = array("d")
    totals = [0, 0]
    squares_kernel.score_new(tops, 0, gains, (1.0, 0.5, 0.25), (1, 3), [], dcgs, [1] * 700, totals)
    expected = [value for n in range(700)
                for value in (gains[f"d{n}"], gains[f"d{n}"] + 0.25 * gains[f"e{n}"])]
    assert list(dcgs) == expected
    assert totals == [sum(exact(v * v) for v in expected[0::2]), sum(exact(v * v) for v in expected[1::2])]


def test_the_exact_sums_hold_subnormal_and_huge_squares_and_large_counts() -> None:
    assert squares_kernel is not None
    values = [5e-324, 1e-170, 3e-160, 1.5, 1e150, 1.3407807929942596e154]
    tops: list[tuple[str | None, ...]] = [(f"v{i}",) for i in range(len(values))]
    gains = {f"v{i}": value for i, value in enumerate(values)}
    counts = [1, 3, (1 << 63) - 1, 7, 1 << 40, 2]
    totals = [5]
    masks: list[int] = []
    dcgs = array("d")
    assert squares_kernel.score_new(tops, 0, gains, (1.0,), (1,), masks, dcgs, counts, totals)
    assert totals == [5 + sum(count * exact(value * value) for count, value in zip(counts, values, strict=True))]
    assert masks == [1] * len(values) and list(dcgs) == values
    # Every grade gone: the rescoring takes each square back out, to the total it started from.
    assert squares_kernel.rescore(None, tops, masks, dcgs, counts, set(gains), {}, (1.0,), (1,), totals)
    assert totals == [5] and masks == [0] * len(values) and list(dcgs) == [0.0] * len(values)


def test_wrong_arguments_are_refused_not_read() -> None:
    assert squares_kernel is not None
    with pytest.raises(TypeError):
        squares_kernel.score_new([("a",)], 0, {"a": 1.0}, (1.0,), (1,), [], array("d"), [1], [0, 0])
    with pytest.raises(ValueError, match="MAX_DEPTH"):
        squares_kernel.score_new([], 0, {}, (1.0,) * (squares_kernel.MAX_DEPTH + 1), (1,), [], array("d"), [], [0])
    with pytest.raises(IndexError):
        squares_kernel.rescore({"a": [3]}, [("a",)], [1], array("d", [1.0]), [1], {"a"}, {"a": 2.0}, (1.0,), (1,), [0])
    with pytest.raises(TypeError, match="array of doubles"):
        squares_kernel.rescore(None, [("a",)], [1], array("f", [1.0]), [1], {"a"}, {"a": 2.0}, (1.0,), (1,), [0])
    # A square past the doubles' range: refused as `window_sums.exact` refuses it.
    with pytest.raises(OverflowError):
        squares_kernel.score_new([("a",)], 0, {"a": 1e200}, (1.0,), (1,), [], array("d"), [1], [0])
