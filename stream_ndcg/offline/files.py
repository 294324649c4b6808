"""Files of events, one JSON object a line, fed to a replay: what `stream-ndcg replay` reads."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import BinaryIO

from stream_ndcg.events import InvalidEvent
from stream_ndcg.offline.replay import Replay


def replay_files(replay: Replay, paths: Sequence[str]) -> bool:
    """Apply every line of the files (``-``: standard input), saying each rejection on stderr with
    its file and line; False if a file could not be read or had lines that were all rejected."""
    progress = Progress(sum(os.path.getsize(p) for p in paths if p != "-" and os.path.isfile(p)))
    usable_all = True
    for path in paths:
        try:
            if path == "-":
                usable = replay_stream(replay, "<stdin>", sys.stdin.buffer, progress)
            else:
                with open(path, "rb") as stream:
                    usable = replay_stream(replay, path, stream, progress)
        except OSError as exc:
            print(f"stream-ndcg replay: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
            usable = False
        usable_all = usable_all and usable
    progress.close()
    return usable_all


class Progress:
    """A one-line progress report on stderr, only when a person is watching it."""

    def __init__(self, total_bytes: int) -> None:
        self.enabled = sys.stderr.isatty() and total_bytes > 1_000_000
        self.total = total_bytes
        self.done = 0

    def advance(self, nbytes: int) -> None:
        previous = self.done
        self.done += nbytes
        if self.enabled and self.done * 100 // self.total != previous * 100 // self.total:
            sys.stderr.write(f"\rreplay: {self.done * 100 // self.total:3d}% of {self.total:,} bytes")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def replay_stream(replay: Replay, name: str, stream: BinaryIO, progress: Progress) -> bool:
    """Apply a file's lines; False if it had lines and every one was rejected."""
    lines = rejected = 0
    for number, line in enumerate(stream, start=1):
        progress.advance(len(line))
        if not line.strip():
            continue
        lines += 1
        rejection = replay.add(line.rstrip(b"\r\n"))
        if isinstance(rejection, InvalidEvent):
            rejected += 1
            print(f"{name}:{number}: rejected ({rejection.reason}): {rejection.detail}", file=sys.stderr)
    if lines and rejected == lines:
        print(f"stream-ndcg replay: every line of {name} ({lines}) was rejected: is it a file of events, "
              "one JSON object a line (see the event contract in the README)?", file=sys.stderr)
        return False
    return True
