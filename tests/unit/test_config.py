"""Settings: precedence of the sources, validation, and secrets kept out of sight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_ndcg.cli import main
from stream_ndcg.config import Settings, mask_url, parse_duration_ms
from stream_ndcg.errors import ConfigError


def test_flags_win_over_environment_over_file(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text('[stream_ndcg]\nbatch_size = 50\ngroup_id = "from-file"\nk = [3, 7]\nwindows = ["1m", "1h"]\n')
    settings = Settings.load(flags={"batch_size": "70"},
                             environ={"STREAM_NDCG_GROUP_ID": "from-env", "STREAM_NDCG_BATCH_SIZE": "60"},
                             config_file=str(config))
    assert settings.batch_size == 70
    assert settings.group_id == "from-env"
    assert settings.k == (3, 7)
    assert settings.windows == (60_000, 3_600_000)
    assert settings.horizon == 3_600_000 + 600_000


def test_defaults() -> None:
    settings = Settings.load()
    assert settings.topics == ("search-events",)
    assert settings.windows == (300_000, 3_600_000, 86_400_000)
    assert settings.measure.cutoffs == (5, 10)
    assert settings.metrics_host == "127.0.0.1"


@pytest.mark.parametrize(("flags", "message"), [
    ({"k": "0"}, "positive"),
    ({"gain": "cubic"}, "gain"),
    ({"clock": "sundial"}, "clock"),
    ({"windows": "90s", "bucket": "1m"}, "whole number of buckets"),
    ({"segment_labels": "k"}, "label"),
    ({"segment_labels": "bad-label"}, "label"),
    ({"metrics_port": "70000"}, "port"),
    ({"batch_size": "many"}, "integer"),
    ({"windows": "5 minutes"}, "duration"),
    ({"redis_url": "http://127.0.0.1"}, "redis"),
    ({"redis_cluster": "true", "redis_url": "redis://127.0.0.1:7000/2"}, "database 0"),
    ({"redis_cluster": "true", "redis_url": "unix:///run/redis.sock"}, "TCP"),
    ({"redis_cluster": "sometimes"}, "boolean"),
    ({"group_id": "team/search"}, "namespace \\(by default the group id\\)"),
    ({"colour": "blue"}, "unknown setting"),
])
def test_invalid_settings_are_refused_with_a_reason(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.load(flags=flags)


def test_the_namespace_is_the_group_id_unless_set() -> None:
    assert Settings.load(flags={"group_id": "ranker-eval"}).key_namespace == "ranker-eval"
    assert Settings.load(flags={"group_id": "ranker-eval", "namespace": "shared"}).key_namespace == "shared"


def test_the_metric_configuration_names_what_the_numbers_mean() -> None:
    config = Settings.load(flags={"k": "3,10", "gain": "linear", "windows": "5m,1h"}).metric_config
    assert config == {"k": [3, 10], "gain": "linear", "ideal": "pool", "bucket": 60_000,
                      "windows": [300_000, 3_600_000], "segment_labels": ["variant"]}


def test_durations() -> None:
    assert parse_duration_ms("5m") == 300_000
    assert parse_duration_ms("250") == 250
    assert parse_duration_ms("2d") == 172_800_000


def test_passwords_are_masked() -> None:
    assert mask_url("redis://svc:hunter2@redis:6379/0") == "redis://svc:***@redis:6379/0"
    assert mask_url("rediss://:hunter2@redis:6380") == "rediss://***@redis:6380"
    assert mask_url("redis://redis:6379/0") == "redis://redis:6379/0"


def test_check_config_prints_the_effective_settings_without_secrets(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_NDCG_REDIS_URL", "redis://svc:hunter2@10.0.0.1:6379/0")
    assert main(["check-config", "--k", "1,3", "--windows", "1m,10m"]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out
    shown = json.loads(out)
    assert shown["redis_url"] == "redis://svc:***@10.0.0.1:6379/0"
    assert shown["k"] == [1, 3]
    assert shown["windows"] == ["1m", "10m"]


def test_a_bad_setting_exits_2_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "--clock", "sundial"]) == 2
    assert "clock" in capsys.readouterr().err
