"""An upgrade without a cliff: state built by release 0.1.0, or by the last commit that wrote state
format 3, 4, 5, 6 or 7, stopped mid-stream, is continued by the working tree, and the numbers equal
the replay of the whole stream to 1e-9; and a rollback: state the working tree wrote told to write
format 7 (or 6) is continued by the last commit that wrote it, with the same numbers."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from stream_ndcg.config import Settings
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.events import Impression, parse_event
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay
from tests.support.replay import (
    CUTOFFS,
    assert_close_figures,
    compared_gauges,
    expect_equal_to_replay,
    replay_of,
    simulated,
)
from tests.support.service import Samples, Service, wait_for_messages, wait_for_progress, wait_for_query_figures
from tests.support.topics import create_topic, send_paced

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
# The commit tagged v0.1.0 (a clone may not carry the tag; it carries the commit).
RELEASE_0_1_0 = "be40db58433b175470fb1580dffbe4f31990690f"
# The last commit that wrote state format 3 (before judgment sources, #28).
FORMAT_3 = "56cf76aaa703e53d7106af8700e02081b1882cfd"
# The last commit that wrote state format 4 (before the sums of squares, #29).
FORMAT_4 = "5446c1c7fb40094b1c6418e6e5e81d037227207d"
# The last commit that wrote state format 5 (before the experiments' cells, #29).
FORMAT_5 = "5d6871ee9e93c696b3a07dea268f9381664e8620"
# The last commit that wrote state format 6 (before the compact groups, #30).
FORMAT_6 = "c9258eb7873a0ee527cd61e325e535e66aa934c8"
# The last commit that wrote state format 7 (before the sharded rows and impression ids, #30).
FORMAT_7 = "4ecc83059b9732541e810f14b0d9414408713aaf"


def release_0_1_0(into: Path) -> Path:
    return package_of(RELEASE_0_1_0, into)


def package_of(commit: str, into: Path) -> Path:
    """The package of a commit, extracted from git (no work tree, no repository change)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, "stream_ndcg"],
                             capture_output=True, check=False)
    assert archive.returncode == 0, f"commit {commit} is not in this clone: {archive.stderr!r}"
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


def first_then_second(first: str | None, second: str | None, kafka: KafkaBroker, service_env: dict[str, str],
                      services: list[Service], tmp_path: Path, before: list[tuple[bytes, bytes]],
                      after: list[tuple[bytes, bytes]], settings: dict[str, str] | None = None,
                      first_settings: dict[str, str] | None = None,
                      second_settings: dict[str, str] | None = None) -> tuple[Service, Samples]:
    """One service takes in `before` and stops; a second goes on with `after` on the same Redis and
    topic, both with `settings`, each with its own added. Each is the package of a commit, or the
    working tree (None): an upgrade is an old commit first, a rollback the working tree first.
    The second service, running, and its samples once it has taken in every message."""
    topic = create_topic(kafka.bootstrap, partitions=2)
    env = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_BATCH_SIZE="200",
               **(settings or {}))
    ran: list[Service] = []
    for n, (commit, own) in enumerate(((first, first_settings), (second, second_settings))):
        home = tmp_path / f"service-{n}"
        home.mkdir()
        if commit is None:
            ran.append(Service({**env, **(own or {})}, home))
        else:
            code = package_of(commit, tmp_path / f"code-{commit[:8]}")
            # -P: the repository (the working directory) must not come before PYTHONPATH on sys.path.
            ran.append(Service({**env, **(own or {}), "PYTHONPATH": str(code)}, home, python=(sys.executable, "-P")))
    services.extend(ran)
    first_service, second_service = ran
    first_service.start()
    send_paced(kafka.bootstrap, topic, before, 2_000.0).join()
    wait_for_messages(first_service, len(before))
    assert first_service.stop() == 0
    second_service.start()
    send_paced(kafka.bootstrap, topic, after, 2_000.0).join()
    return second_service, wait_for_messages(second_service, len(before) + len(after))


def old_then_new(commit: str, kafka: KafkaBroker, service_env: dict[str, str], services: list[Service],
                 tmp_path: Path, before: list[tuple[bytes, bytes]], after: list[tuple[bytes, bytes]],
                 settings: dict[str, str] | None = None,
                 new_settings: dict[str, str] | None = None) -> tuple[Service, Samples]:
    """An upgrade: the package of `commit` first, the working tree (with `new_settings`) second."""
    return first_then_second(commit, None, kafka, service_env, services, tmp_path, before, after, settings,
                             second_settings=new_settings)


def from_other_sources(messages: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The messages with every second judgment from a click model (COEC or SDBN in turn): some fill
    a gap of raters, some are behind a rater's grade."""
    changed: list[tuple[bytes, bytes]] = []
    judgments = 0
    for key, value in messages:
        try:
            event = json.loads(value)
        except ValueError:
            event = None
        if isinstance(event, dict) and event.get("type") == "judgment":
            judgments += 1
            if judgments % 2:
                event["source"] = ("coec", "sdbn")[judgments // 2 % 2]
                value = json.dumps(event).encode()
        changed.append((key, value))
    return changed


def test_state_of_format_3_is_read_as_raters_and_continued_with_other_sources(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    messages = simulated(8_000, seed=43)
    # The state of format 3 holds raters' judgments only: every event with a source comes after it stopped.
    before, after = messages[:4_000], from_other_sources(messages[4_000:])
    new, samples = old_then_new(FORMAT_3, kafka, service_env, services, tmp_path, before, after)
    assert expect_equal_to_replay(samples, replay_of(before + after), "1d", CUTOFFS) == compared_gauges()
    assert all(samples[("stream_ndcg_judgments_total", (("source", source),))] > 0 for source in ("coec", "sdbn"))
    assert new.stop() == 0


def test_state_of_format_4_takes_its_squares_and_its_errors_equal_the_replays(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    messages = simulated(8_000, seed=47)
    before, after = messages[:4_000], messages[4_000:]
    # Then every query of the old state once more: a judgment of a document no list shows (grade
    # 0, no gain) moves no figure but loads the query, whose groups take their squares.
    last_ts = max(int(found.group(1)) for _, value in messages if (found := re.search(rb'"ts": (\d+)', value)))
    after += [(key, json.dumps({"type": "judgment", "query_id": key.decode(), "doc_id": "probe", "grade": 0,
                                "ts": last_ts}).encode()) for key in sorted({key for key, _ in before if key})]
    messages = before + after
    new, samples = old_then_new(FORMAT_4, kafka, service_env, services, tmp_path, before, after)
    # The clustered errors and query-averaged means of every message taken in.
    samples = wait_for_query_figures(new)
    summary = replay_of(messages)
    assert expect_equal_to_replay(samples, summary, "1d", CUTOFFS) == compared_gauges()
    # A group of format 4 takes its squares when its query comes again: every one came, so every
    # impression of the window has them, and the squares and both errors are the replay's.
    replay = Replay(Measure(cutoffs=CUTOFFS), dedup_horizon_ms=Settings().dedup_horizon)
    for _, value in messages:
        replay.add(value)
    for variant, by_k in summary["by_segment"]["variant"].items():
        labels = {"window": "1d", "variant": variant}
        squared = samples[("stream_ndcg_squared_impressions", tuple(sorted(labels.items())))]
        impressions = samples[("stream_ndcg_impressions", tuple(sorted(labels.items())))]
        assert squared == impressions
        scores = [row for row in replay.per_impression() if row["segment"].get("variant") == variant]
        for k in map(str, CUTOFFS):
            key = tuple(sorted({**labels, "k": k}.items()))
            ndcgs = [row["ndcg"][k] for row in scores if row["ndcg"][k] is not None]
            expected = {"stream_ndcg_ndcg_squares": math.fsum(v * v for v in ndcgs),
                        "stream_ndcg_dcg_squares": math.fsum(row["dcg"][k] ** 2 for row in scores),
                        "stream_ndcg_ndcg_standard_error": by_k[k]["ndcg_standard_error"],
                        "stream_ndcg_ndcg_clustered_standard_error": by_k[k]["ndcg_clustered_standard_error"],
                        "stream_ndcg_ndcg_query_mean": by_k[k]["ndcg_query_mean"]}
            for name, value in expected.items():
                assert samples[(name, key)] == pytest.approx(value, abs=1e-9), (name, key)
    assert new.stop() == 0


def test_state_of_format_5_takes_an_experiment_whose_figures_equal_the_replays(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    messages = simulated(8_000, seed=53)
    before, after = messages[:4_000], messages[4_000:]
    # The experiment starts after every event the old release took in: each partition's clock is
    # behind its start, so each counts from its first bucket, as the replay does. Buckets of a
    # second: the stream is forty seconds of event time, and an experiment counts whole buckets.
    start = 1 + max(int(found.group(1)) for _, value in before if (found := re.search(rb'"ts": (\d+)', value)))
    flag = f"name=upgrade,start={start},label=variant,arms=A|B,control=A,n_star=2000"
    new, samples = old_then_new(FORMAT_5, kafka, service_env, services, tmp_path, before, after,
                                {"STREAM_NDCG_BUCKET": "1s"}, {"STREAM_NDCG_EXPERIMENTS": flag})
    assert expect_equal_to_replay(samples, replay_of(messages), "1d", CUTOFFS) == compared_gauges()
    status, served = new.api("/api/v1/experiments/upgrade")
    assert status == 200
    settings = Settings.load(flags={"experiments": flag, "bucket": "1s"})
    replay = Replay(Measure(cutoffs=CUTOFFS), dedup_horizon_ms=settings.dedup_horizon, bucket_ms=settings.bucket)
    for _, value in messages:
        replay.add(value)
    expected = replay.summary(experiments=settings.experiments)["experiments"]["upgrade"]
    assert served["counting_from_ms"] == expected["counting_from_ms"]
    for k in map(str, CUTOFFS):
        for arm in ("A", "B"):
            assert served["k"][k]["arms"][arm]["scored_impressions"] == expected["k"][k]["arms"][arm][
                "scored_impressions"] > 0
        assert_close_figures(served["k"][k], expected["k"][k])
    assert new.stop() == 0



def test_state_of_format_6_is_continued_in_format_7_and_its_figures_equal_the_replays(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    messages = simulated(8_000, seed=59)
    before, after = messages[:4_000], messages[4_000:]
    new, samples = old_then_new(FORMAT_6, kafka, service_env, services, tmp_path, before, after)
    assert expect_equal_to_replay(samples, replay_of(messages), "1d", CUTOFFS) == compared_gauges()
    assert new.stop() == 0


def test_state_of_format_7_is_continued_in_format_8_its_ids_kept_and_its_figures_equal_the_replays(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    messages = simulated(8_000, seed=67)
    before, after = messages[:4_000], messages[4_000:]
    # Every second impression of the first half sent again after it: format 7's ids make them
    # duplicates (but the malformed ones, which no id made it into the state with).
    resent = [(key, value) for key, value in before if isinstance(parse_event(value), Impression)][::2]
    new, samples = old_then_new(FORMAT_7, kafka, service_env, services, tmp_path, before, resent + after)
    assert expect_equal_to_replay(samples, replay_of(before + resent + after), "1d", CUTOFFS) == compared_gauges()
    assert sum(value for (name, labels), value in samples.items() if name == "stream_ndcg_events_duplicate_total"
               and ("type", "impression") in labels) == len(resent)
    assert new.stop() == 0


@pytest.mark.parametrize(("written", "release", "seed"), [(6, FORMAT_6, 61), (7, FORMAT_7, 71)])
def test_state_written_in_an_earlier_format_when_told_to_is_continued_by_the_last_release_that_wrote_it(
        written: int, release: str, seed: int, kafka: KafkaBroker, service_env: dict[str, str],
        services: list[Service], tmp_path: Path) -> None:
    """The rollback: the working tree with state_format = 6 or 7 hands its state back to the last
    release that wrote that format, which reads it and goes on; the figures equal the replay's."""
    messages = simulated(8_000, seed=seed)
    before, after = messages[:4_000], messages[4_000:]
    old, samples = first_then_second(None, release, kafka, service_env, services, tmp_path, before, after,
                                     first_settings={"STREAM_NDCG_STATE_FORMAT": str(written)})
    assert expect_equal_to_replay(samples, replay_of(messages), "1d", CUTOFFS) == compared_gauges()
    assert old.stop() == 0
