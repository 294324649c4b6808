"""The `stream-ndcg` command: replay, run, check-config and dev."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import BinaryIO

from stream_ndcg.events import InvalidEvent, Limits
from stream_ndcg.metric import GAINS, IDEALS, Measure
from stream_ndcg.replay import Replay


def parse_cutoffs(text: str) -> tuple[int, ...]:
    try:
        cutoffs = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"k must be a comma-separated list of integers, got {text!r}") from None
    if not cutoffs or min(cutoffs) < 1:
        raise argparse.ArgumentTypeError(f"k must be positive integers, got {text!r}")
    return cutoffs


class _Progress:
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


def _replay_stream(replay: Replay, name: str, stream: BinaryIO, progress: _Progress) -> None:
    for number, line in enumerate(stream, start=1):
        progress.advance(len(line))
        if not line.strip():
            continue
        rejection = replay.add(line.rstrip(b"\r\n"))
        if isinstance(rejection, InvalidEvent):
            print(f"{name}:{number}: rejected ({rejection.reason}): {rejection.detail}", file=sys.stderr)


def cmd_replay(args: argparse.Namespace) -> int:
    measure = Measure(cutoffs=args.k, gain=args.gain, ideal=args.ideal)
    replay = Replay(measure, Limits(max_results=args.max_results))
    sizes = [os.path.getsize(p) for p in args.files if p != "-" and os.path.isfile(p)]
    progress = _Progress(sum(sizes))
    status = 0
    for path in args.files:
        if path == "-":
            _replay_stream(replay, "<stdin>", sys.stdin.buffer, progress)
            continue
        try:
            with open(path, "rb") as stream:
                _replay_stream(replay, path, stream, progress)
        except OSError as exc:
            print(f"stream-ndcg replay: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
            status = 1
    progress.close()
    if args.per_impression:
        with open(args.per_impression, "w", encoding="utf-8") as out:
            for record in replay.per_impression():
                out.write(json.dumps(record) + "\n")
    json.dump(replay.summary(), sys.stdout)
    sys.stdout.write("\n")
    return status


def _add_measure_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k", type=parse_cutoffs, default=(5, 10), help="cut-offs, comma-separated (default 5,10)")
    parser.add_argument("--gain", choices=GAINS, default="exponential", help="gain formula (default exponential)")
    parser.add_argument("--ideal", choices=IDEALS, default="pool", help="ideal ordering (default pool)")
    parser.add_argument("--max-results", type=int, default=1000, help="longest accepted list (default 1000)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stream-ndcg", description="Streaming DCG/nDCG@k for search rankings.")
    sub = parser.add_subparsers(dest="command", required=True)
    replay = sub.add_parser("replay", help="compute the metrics from files of events, no servers")
    replay.add_argument("files", nargs="+", metavar="EVENTS.jsonl",
                        help="event files, one JSON object a line; - for stdin")
    _add_measure_flags(replay)
    replay.add_argument("--per-impression", metavar="OUT.jsonl", help="write one line of scores per impression")
    replay.set_defaults(handler=cmd_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    status: int = args.handler(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
