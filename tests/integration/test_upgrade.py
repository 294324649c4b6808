"""An upgrade without a cliff: state built by release 0.1.0, stopped mid-stream, is continued by the
working tree, and the numbers equal the replay of the whole stream to 1e-9."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from stream_ndcg.devtools.servers import KafkaBroker
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of, simulated
from tests.support.service import Service, wait_for_messages, wait_for_progress
from tests.support.topics import create_topic, send_paced

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
# The commit tagged v0.1.0 (a clone may not carry the tag; it carries the commit).
RELEASE_0_1_0 = "be40db58433b175470fb1580dffbe4f31990690f"


def release_0_1_0(into: Path) -> Path:
    """The package of release 0.1.0, extracted from git (no work tree, no repository change)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", RELEASE_0_1_0, "stream_ndcg"],
                             capture_output=True, check=False)
    assert archive.returncode == 0, f"release 0.1.0 ({RELEASE_0_1_0}) is not in this clone: {archive.stderr!r}"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def test_state_of_release_0_1_0_is_continued_exactly(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    old_code = release_0_1_0(tmp_path / "v0.1.0")
    topic = create_topic(kafka.bootstrap, partitions=2)
    messages = simulated(12_000, seed=41)
    env = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_BATCH_SIZE="200")
    # -P: the repository (the working directory) must not come before PYTHONPATH on sys.path.
    old = Service({**env, "PYTHONPATH": str(old_code)}, tmp_path / "old", python=(sys.executable, "-P"))
    new = Service(env, tmp_path / "new")
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    services.extend([old, new])
    which = subprocess.run([*old.python, "-c", "import stream_ndcg; print(stream_ndcg.__file__)"],
                           env=dict(os.environ, **old.env), capture_output=True, text=True, check=True)
    assert which.stdout.startswith(str(old_code)), which.stdout

    old.start()
    # Paced, so that the old release is stopped with part of the stream still unread.
    sender = send_paced(kafka.bootstrap, topic, messages, 1_500.0)
    reached = wait_for_progress(old, len(messages) // 3)
    assert old.stop() == 0
    assert reached < len(messages), "the old release read the whole stream: nothing left to continue"
    new.start()
    sender.join()
    samples = wait_for_messages(new, len(messages))
    assert expect_equal_to_replay(samples, replay_of(messages), "1d", CUTOFFS) == compared_gauges()
    assert new.stop() == 0
