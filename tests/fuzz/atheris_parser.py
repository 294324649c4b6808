"""Coverage-guided fuzzing of the event parser with atheris: no message, under any limits, makes it raise.

An input is a message followed by a few bytes that become tight `Limits` (FuzzedDataProvider takes its
numbers from the end). Each message is parsed under the default limits, which lets it reach the deep
checks, and under the tight ones, which it then crosses.
test_atheris.py runs this script; by hand::

    python tests/fuzz/atheris_parser.py -max_len=4096 -artifact_prefix=/tmp/ CORPUS_DIR

With STREAM_NDCG_FUZZ_SELFTEST=1 an accepted impression counts as a failure, so that one can see a
failing check reported as a crash.
"""

from __future__ import annotations

import json
import os
import sys

import atheris

with atheris.instrument_imports(include=["stream_ndcg"]):
    from stream_ndcg.events import DEFAULT_LIMITS, Click, Impression, InvalidEvent, Judgment, Limits, parse_event

SELFTEST = os.environ.get("STREAM_NDCG_FUZZ_SELFTEST") == "1"
ALLOWED_OUTCOMES = (Judgment, Click, InvalidEvent) if SELFTEST else (Impression, Judgment, Click, InvalidEvent)


def tight_limits(provider: atheris.FuzzedDataProvider) -> Limits:
    # Small enough that ordinary ids, result lists, segments and messages cross them.
    return Limits(
        max_results=provider.ConsumeIntInRange(0, 8),
        max_message_bytes=provider.ConsumeIntInRange(0, 4096),
        max_id_length=provider.ConsumeIntInRange(0, 16),
        max_segment_keys=provider.ConsumeIntInRange(0, 3),
    )


# Named as libFuzzer and atheris name the entry point.
def TestOneInput(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    tight = tight_limits(provider)
    message = provider.ConsumeBytes(provider.remaining_bytes())
    for limits in (DEFAULT_LIMITS, tight):
        event = parse_event(message, limits)
        assert isinstance(event, ALLOWED_OUTCOMES), event
        if not isinstance(event, InvalidEvent):
            json.dumps(event._asdict(), ensure_ascii=False).encode("utf-8")  # whatever is accepted can be stored


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
