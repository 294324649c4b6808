"""The atheris harness of the event parser: it runs clean, and it does report a failing check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

pytestmark = pytest.mark.fuzz

HARNESS = Path(__file__).with_name("atheris_parser.py")
EXAMPLES = Path(__file__).parents[2] / "examples" / "events.jsonl"
SELFTEST_VARIABLE = "STREAM_NDCG_FUZZ_SELFTEST"
# About 20 s on one core of the 2-core CI machine.
RUNS = 1_500_000
# The harness takes tight Limits from an input's last five bytes; these let ids of five characters, three
# results and one segment key through, so the examples are rejected by the tight limits in different places.
TIGHT_LIMITS_TRAILER = bytes([1, 5, 0, 1, 3])
# Paths the examples do not lead to and the fuzzer rarely finds by itself.
HAND_WRITTEN_SEEDS = [
    b'{"type":"judgment","query_id":"q\\ud800","doc_id":"d","grade":1,"ts":1}',
    b'{"type":"judgment","query_id":"q","doc_id":"d","grade":NaN,"ts":-Infinity}',
    b'{"type":"impression","impression_id":"i","query_id":"q","ts":"2026-11-22T10:00:00","results":["a"]}',
    b'{"type":"click","impression_id":"i","query_id":"q","doc_id":"a","ts":"2026-11-22T10:00:05Z","event_id":"c"}',
    b"[" * 3000,
]


@pytest.fixture
def seed_corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for number, line in enumerate(EXAMPLES.read_bytes().splitlines() + HAND_WRITTEN_SEEDS):
        (corpus / f"seed-{number}").write_bytes(line + TIGHT_LIMITS_TRAILER)
    return corpus


def fuzz(corpus: Path, artifacts: Path, runs: int, *, selftest: bool) -> subprocess.CompletedProcess[str]:
    artifacts.mkdir()
    env = {name: value for name, value in os.environ.items() if name != SELFTEST_VARIABLE}
    if selftest:
        env[SELFTEST_VARIABLE] = "1"
    # The working directory is temporary too, so that nothing libFuzzer writes can land in the repository.
    return subprocess.run(
        [sys.executable, str(HARNESS), f"-runs={runs}", "-max_len=4096", f"-artifact_prefix={artifacts}/",
         str(corpus)],
        cwd=artifacts, env=env, capture_output=True, text=True, errors="replace", timeout=600, check=False)


def test_no_fuzzed_message_makes_the_parser_raise(seed_corpus: Path, tmp_path: Path) -> None:
    run = fuzz(seed_corpus, tmp_path / "artifacts", RUNS, selftest=False)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-5000:]
    assert f"Done {RUNS} runs" in output, output[-5000:]
    assert not any((tmp_path / "artifacts").iterdir())


def test_the_harness_reports_a_failing_check(seed_corpus: Path, tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    run = fuzz(seed_corpus, artifacts, 1000, selftest=True)
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-5000:]
    assert "Uncaught Python exception" in output and "AssertionError: Impression(" in output, output[-5000:]
    assert [path.name.startswith("crash-") for path in artifacts.iterdir()] == [True]
