"""The text of a list of sums, as state formats 7 and 8 store a group's and a drill-down row's.

    numbers_text([22.0, 0.0, 0.1 + 0.2])    # "22,,'|NDMzMzMz0z8="
    numbers_of("22,,'|NDMzMzMz0z8=")        # [22.0, 0.0, 0.30000000000000004]

Written for every group and row a batch changes (`state.compact_format`, `state.shard_format`).
"""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Sequence

import orjson

# A number whose shortest text is longer is written as a quote, and its 8 bytes at the end, with
# those of the other long ones, in base 64 (about 11 characters a number, read back in C): a lone
# one costs its quote, the '|' and 11 or 12 characters, so a text of 13 is never longer.
_DENSEST = 13
# A number whose shortest text is longer than _DENSEST, between the commas of numbers_text's text.
_LONG = re.compile(rb"[^,]{%d}" % (_DENSEST + 1))


def numbers_text(values: Sequence[float], repeats: bool = False) -> str:
    """Sums, comma-separated, each as its shortest text ('2' for 2.0, '' for 0) or, when that is
    longer than 13 characters, as a quote; then, after '|', the long ones' doubles in base 64:
    read back, the same doubles. orjson writes the shortest texts, in C. With `repeats` (format 8)
    a long sum equal to one before it has no bytes of its own: '"' when it is the last one written,
    '"<n>' the n-th (a row's exposure and unjudged part are one number while none is judged, a
    group's figures at 10 those at 5 while nothing below 5 is judged); the base 64 is unpadded."""
    # No step per number in the interpreter's loops unless some number is long: each number
    # between commas, a zero (',0.0,', or ',-0.0,': -0.0 comes back as 0.0, which no sum tells
    # apart) is written as nothing (most sums of a group of the tail are 0). A replace takes every
    # other zero of a run, each match taking the comma the next one starts with: a second pass, if
    # any is left, takes the rest. Then whole numbers lose their '.0'.
    text = (b"," + orjson.dumps(values)[1:-1] + b",").replace(b",0.0,", b",,")
    if b"0.0," in text:
        text = text.replace(b",0.0,", b",,").replace(b",-0.0,", b",,").replace(b",-0.0,", b",,")
    text = text.replace(b".0,", b",")
    if _LONG.search(text) is None:
        return text[1:-1].decode()
    parts = text[1:-1].decode().split(",")
    long = [i for i, part in enumerate(parts) if len(part) > _DENSEST]
    dense: list[float] = []
    written: dict[float, int] = {}
    for i in long:
        at = written.get(values[i]) if repeats else None
        if at is None:
            parts[i] = "'"
            written.setdefault(values[i], len(dense))
            dense.append(values[i])
        else:
            parts[i] = '"' if values[i] == dense[-1] else f'"{at}'
    blob = base64.b64encode(struct.pack(f"<{len(dense)}d", *dense)).decode()
    return ",".join(parts) + "|" + (blob.rstrip("=") if repeats else blob)


def numbers_of(text: str) -> list[float]:
    """The sums `numbers_text` wrote (with `repeats` or without)."""
    head, _, blob = text.partition("|")
    parts = head.split(",")
    if not blob:
        return [float(part) if part else 0.0 for part in parts]
    raw = base64.b64decode(blob + "=" * (-len(blob) % 4))
    dense = struct.unpack(f"<{len(raw) // 8}d", raw)
    numbers: list[float] = []
    read = 0
    for part in parts:
        if part == "'":
            read += 1
        numbers.append(dense[read - 1] if part in ("'", '"') else dense[int(part[1:])] if part[:1] == '"'
                       else float(part) if part else 0.0)
    return numbers
