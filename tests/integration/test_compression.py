"""Compressed topics, read by the service as a user installs it: `pip install .`, no dev extras.

Batches of all four codecs, from kafka-python producers and from the Java client (xerial
snappy, lz4 frame) that the stack's producers use, are mixed in one topic; the numbers equal
the replay. A service whose installation lacks a codec's library says which partition,
offset and codec hold it up, once, reports not ready with the cause on /metrics, skips
nothing, and catches up once run with the library.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.partitioner.default import murmur2
from kafka.record import MemoryRecords

from stream_ndcg.devtools.servers import KafkaBroker, kafka_tools_classpath
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of
from tests.support.service import Samples, Service, settled, wait_for_messages
from tests.support.topics import create_topic
from tests.support.wait import holds, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

REPO = Path(__file__).resolve().parents[2]
# The codec ids of a record batch's attributes (the Kafka protocol's).
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
# Run in the installed venv, so that its codec libraries (not the dev venv's) compress.
PYTHON_PRODUCER = """
import sys
from stream_ndcg.devtools.producer import produce
lines = sys.stdin.buffer.read().splitlines()
produce(sys.argv[1], sys.argv[2], [tuple(line.split(b"\\t", 1)) for line in lines], compression_type=sys.argv[3])
"""
Messages = list[tuple[bytes, bytes]]


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a venv holding `pip install <repo>`, built once per session."""
    root = tmp_path_factory.mktemp("installed")
    # A copy of what the package is built from: an in-tree build would leave build/ in the repo.
    source = root / "source"
    source.mkdir()
    shutil.copy(REPO / "pyproject.toml", source)
    shutil.copy(REPO / "README.md", source)
    shutil.copytree(REPO / "stream_ndcg", source / "stream_ndcg", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
                   check=True, timeout=600)
    return python


@pytest.fixture(scope="session")
def installed_without_zstd(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same installation less zstandard, as if a deployment had dropped it."""
    venv = tmp_path_factory.mktemp("without-zstd") / "venv"
    shutil.copytree(installed.parents[1], venv, symlinks=True)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "--yes", "zstandard"], check=True, timeout=120)
    return python


def codecs_available(python: Path) -> dict[str, bool]:
    out = subprocess.run([python, "-I", "-c", "import kafka.codec as c, stream_ndcg; "
                          "print(stream_ndcg.__file__, c.has_gzip(), c.has_snappy(), c.has_lz4(), c.has_zstd())"],
                         check=True, capture_output=True, text=True, timeout=60).stdout.split()
    # -I: the installed package, not the work tree that PYTHONPATH points to.
    assert out[0].startswith(str(python.parents[1])), out[0]
    return dict(zip(("gzip", "snappy", "lz4", "zstd"), (flag == "True" for flag in out[1:]), strict=True))


def lines(messages: Messages) -> bytes:
    """`key<TAB>value` lines, the input of both producers."""
    for key, value in messages:
        assert b"\t" not in key + value and b"\n" not in key + value, "not expressible as a line"
    return b"".join(key + b"\t" + value + b"\n" for key, value in messages)


def produce_python(python: Path, bootstrap: str, topic: str, codec: str, messages: Messages) -> None:
    subprocess.run([python, "-I", "-c", PYTHON_PRODUCER, bootstrap, topic, codec], input=lines(messages),
                   check=True, timeout=120)


def produce_java(bootstrap: str, topic: str, codec: str, messages: Messages) -> None:
    """Kafka's console producer: the Java client, as the stack's producers, with its codecs."""
    java = shutil.which("java")
    assert java is not None, "Java is needed for the Kafka broker already"
    done = subprocess.run(
        [java, "-Xmx128m", "-cp", kafka_tools_classpath(), "org.apache.kafka.tools.ConsoleProducer",
         "--bootstrap-server", bootstrap, "--topic", topic, "--compression-codec", codec,
         "--property", "parse.key=true", "--property", "key.separator=\t"],
        input=lines(messages), capture_output=True, timeout=120)
    # It logs failed sends and still exits 0.
    assert done.returncode == 0 and b"ERROR" not in done.stderr, done.stderr.decode(errors="replace")


def batches(kafka: KafkaBroker, topic: str) -> Iterator[tuple[int, int, str, int]]:
    """(partition, base offset, codec, producer id) of every record batch the broker stored."""
    for directory in sorted((kafka.workdir / "data").glob(f"{topic}-*")):
        partition = int(directory.name.rsplit("-", 1)[1])
        for segment in sorted(directory.glob("*.log")):
            records = MemoryRecords(segment.read_bytes())
            while (batch := records.next_batch()) is not None:
                yield partition, batch.base_offset, CODECS[batch.compression_type], batch.producer_id


def partition_of(key: bytes, partitions: int) -> int:
    """Where both clients' default partitioner puts a keyed message."""
    return int((murmur2(key) & 0x7FFFFFFF) % partitions)


def simulated(events: int, seed: int) -> Messages:
    # No malformed messages: they are not all expressible as lines, and compression is the subject here.
    spec = SimulationSpec(events=events, seed=seed, queries=200, rate=200.0, max_delay_ms=600_000)
    return list(Simulator(spec).messages())


def backoffs(samples: Samples, cause: str) -> float:
    return float(samples.get(("stream_ndcg_backoffs_total", (("cause", cause),)), 0.0))


def test_all_four_codecs_from_both_clients_mixed_in_one_topic(
        kafka: KafkaBroker, installed: Path, service_env: dict[str, str], services: list[Service],
        tmp_path: Path) -> None:
    assert codecs_available(installed) == {"gzip": True, "snappy": True, "lz4": True, "zstd": True}
    topic = create_topic(kafka.bootstrap, partitions=2)
    messages = simulated(4_000, seed=31)
    producers = [("python", "gzip"), ("java", "snappy"), ("python", "lz4"), ("java", "zstd"),
                 ("python", "snappy"), ("java", "gzip"), ("python", "zstd"), ("java", "lz4")]
    share = len(messages) // len(producers) + 1
    for index, (client, codec) in enumerate(producers):
        chunk = messages[index * share:(index + 1) * share]
        if client == "java":
            produce_java(kafka.bootstrap, topic, codec, chunk)
        else:
            produce_python(installed, kafka.bootstrap, topic, codec, chunk)
    stored = list(batches(kafka, topic))
    # Each codec written by both clients (two producer ids), into both partitions, interleaved.
    writers = {codec: {producer for _, _, c, producer in stored if c == codec} for codec in CODECS.values()}
    assert {codec: len(ids) for codec, ids in writers.items()} == {
        "none": 0, "gzip": 2, "snappy": 2, "lz4": 2, "zstd": 2}, stored
    assert {partition for partition, *_ in stored} == {0, 1}
    service = Service(dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d"), tmp_path,
                      python=(str(installed), "-I"))
    services.append(service)
    service.start()
    samples = wait_for_messages(service, len(messages), timeout=120)
    assert expect_equal_to_replay(samples, replay_of(messages), "1d", CUTOFFS) == compared_gauges()
    assert backoffs(samples, "UndecodableRecords") == 0
    assert service.becomes_ready(), service.logs()[-3000:]
    assert service.stop() == 0


def test_a_codec_the_installation_lacks_holds_up_its_partition_and_says_so(
        kafka: KafkaBroker, installed: Path, installed_without_zstd: Path, service_env: dict[str, str],
        services: list[Service], tmp_path: Path) -> None:
    assert codecs_available(installed_without_zstd) == {"gzip": True, "snappy": True, "lz4": True, "zstd": False}
    partitions = 3
    topic = create_topic(kafka.bootstrap, partitions=partitions)
    messages = simulated(1_500, seed=41)
    before, middle, after = messages[:600], messages[600:900], messages[900:]
    # One query's messages of the middle go out as zstd batches, so one partition holds them.
    key = Counter(k for k, _ in middle).most_common(1)[0][0]
    stuck = partition_of(key, partitions)
    zstd = [m for m in middle if m[0] == key]
    later = [m for m in middle if m[0] != key] + after
    produce_python(installed, kafka.bootstrap, topic, "gzip", before)
    produce_java(kafka.bootstrap, topic, "zstd", zstd)
    produce_python(installed, kafka.bootstrap, topic, "gzip", later)
    zstd_batches = [(partition, offset) for partition, offset, codec, _ in batches(kafka, topic) if codec == "zstd"]
    assert {partition for partition, _ in zstd_batches} == {stuck}
    first_zstd = min(offset for _, offset in zstd_batches)
    # Everything but what follows the zstd batches in their partition.
    readable = len(before) + sum(1 for k, _ in later if partition_of(k, partitions) != stuck)

    env = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d")
    lacking = Service(env, tmp_path, python=(str(installed_without_zstd), "-I"))
    services.append(lacking)
    lacking.start()

    def held_up() -> Samples | None:
        """The samples once the readable records are in and the undecodable batch was retried a few times."""
        samples = lacking.scrape()
        return samples if settled(samples) >= readable and backoffs(samples, "UndecodableRecords") >= 4 else None

    samples = wait_until(held_up, 60, lambda: lacking.logs()[-5000:], interval=0.3)
    assert settled(samples) == readable, "a record behind the undecodable batch was read, or one was lost"
    assert samples[("stream_ndcg_ready", ())] == 0
    holds(lambda: not lacking.ready(), 1, "not ready while the partition is held up")
    line = (f"cannot decode the records of {topic}:{stuck} at offset {first_zstd}: compressed with zstd, "
            "which this installation cannot decompress (install the Python package zstandard")
    logs = lacking.logs()
    # Said once, at ERROR, however many retries since.
    assert logs.count(line) == 1, logs[-5000:]
    assert f"ERROR stream_ndcg.consumer: {line}" in logs
    assert "Kafka poll failed" not in logs
    assert lacking.stop() == 0

    # With the library, the same group goes on from the stored offsets: nothing skipped, nothing twice.
    complete = Service(env, tmp_path, python=(str(installed), "-I"))
    services.append(complete)
    complete.start()
    samples = wait_for_messages(complete, len(messages), timeout=120)
    assert expect_equal_to_replay(samples, replay_of(before + zstd + later), "1d", CUTOFFS) == compared_gauges()
    assert complete.becomes_ready(), complete.logs()[-3000:]
    assert complete.stop() == 0
