"""Changing the metric configuration of a running pipeline: in place when the state can serve it, exactly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stream_ndcg.devtools.ports import free_port
from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from tests.support.replay import compared_gauges, expect_equal_to_replay, replay_of
from tests.support.service import Service, wait_for_messages
from tests.support.topics import create_topic


def stream_ndcg(command: str, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stream_ndcg.cli", command, *flags],
                          env=dict(os.environ, **env, STREAM_NDCG_METRICS_PORT=str(free_port())),
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_compatible_change_continues_the_state_in_place_and_equals_the_replay(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    """State built with k=5,10, window 1d, split by variant and engine; continued with k=10, windows
    12h and 1d, split by variant: every gauge equals the replay of all the traffic with k=10. (With
    the event clock, 1d and 12h hold every event: the replay has no windows.)"""
    topic = create_topic(kafka.bootstrap, partitions=2)
    spec = SimulationSpec(events=4_000, seed=131, queries=300, rate=200.0, malformed_share=0.01,
                          max_delay_ms=600_000, engines=("bm25", "dense"))
    messages = list(Simulator(spec).messages())
    first_half, second_half = messages[:2_000], messages[2_000:]
    built = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_K="5,10", STREAM_NDCG_WINDOWS="1d",
                 STREAM_NDCG_SEGMENT_LABELS="variant,engine")
    produce(kafka.bootstrap, topic, first_half)
    first = Service(built, tmp_path)
    services.append(first)
    first.start()
    wait_for_messages(first, len(first_half))
    assert first.stop() == 0

    changed = dict(built, STREAM_NDCG_K="10", STREAM_NDCG_WINDOWS="12h,1d", STREAM_NDCG_SEGMENT_LABELS="variant")
    checked = stream_ndcg("check-config", changed, "--state")
    assert checked.returncode == 0, checked.stderr
    assert "stored state: k=5,10 gain=exponential ideal=pool bucket=1m windows=1d segment_labels=engine,variant" \
        in checked.stderr
    for change in ("k: 5 no longer reported", "windows: 12h added", "segment_labels: engine no longer reported"):
        assert f"  - {change}" in checked.stderr, checked.stderr

    second = Service(changed, tmp_path)
    services.append(second)
    second.start()
    produce(kafka.bootstrap, topic, second_half)
    samples = wait_for_messages(second, len(messages))
    summary = replay_of(messages, (10,))
    for window in ("12h", "1d"):
        assert expect_equal_to_replay(samples, summary, window, (10,)) == compared_gauges((10,))
    assert not [labels for (name, labels) in samples if name == "stream_ndcg_ndcg"
                and (("k", "5") in labels or any(label == "engine" for label, _ in labels))]
    assert "metric configuration changed in place: k: 5 no longer reported" in second.logs()
    assert second.stop() == 0

    # The recorded configuration is now k=10: a deeper cut-off needs data the state never kept.
    deeper = dict(changed, STREAM_NDCG_K="10,20")
    checked = stream_ndcg("check-config", deeper, "--state")
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert "  - k: 20 is deeper than the 10 ranks the state keeps of each list" in checked.stderr
    refused = stream_ndcg("run", deeper)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "k: 20 is deeper than the 10 ranks the state keeps of each list" in refused.stderr
    assert "rebuild=true" in refused.stderr
