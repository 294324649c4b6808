"""The compiled core's kernel of `list_squares` (squares_kernel.c): each function does what the
Python loop of `list_squares` it stands for does, on the same containers."""

from array import array
from collections.abc import Set

MAX_DEPTH: int

def score_new(tops: list[tuple[str | None, ...]], first: int, gains: dict[str, float], discounts: tuple[float, ...],
              cutoffs: tuple[int, ...], masks: list[int], dcgs: array[float], counts: list[int],
              totals: list[int]) -> bool: ...
def rescore(showing: dict[str | None, list[int]] | None, tops: list[tuple[str | None, ...]], masks: list[int],
            dcgs: array[float], counts: list[int], moved: Set[str], gains: dict[str, float],
            discounts: tuple[float, ...], cutoffs: tuple[int, ...], totals: list[int]) -> bool: ...
def index_lists(showing: dict[str | None, list[int]], tops: list[tuple[str | None, ...]]) -> None: ...
def take_pending(numbers: dict[tuple[str, ...], int], tops: list[tuple[str | None, ...]], counts: list[int],
                 showing: dict[str | None, list[int]] | None, pending: list[tuple[str, ...]],
                 pending_counts: list[int], pending_plain: list[bool], dcgs: array[float], depth: int,
                 totals: list[int]) -> bool: ...
