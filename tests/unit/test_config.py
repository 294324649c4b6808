"""Settings: precedence of the sources, validation, and secrets kept out of sight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_ndcg.cli import main
from stream_ndcg.config import Settings
from stream_ndcg.errors import ConfigError
from stream_ndcg.setting_flags import help_line, markdown_table
from stream_ndcg.setting_values import mask_url, parse_duration_ms


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
    ({"click_model": "dbn"}, "click_model"),
    ({"click_thresholds": "1,0.5,2"}, "three ascending scores"),
    ({"click_thresholds": "0.5,1"}, "three ascending scores"),
    ({"click_thresholds": "low,mid,high"}, "numbers"),
    ({"click_max_rank": "0"}, "out of range"),
])
def test_invalid_settings_are_refused_with_a_reason(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.load(flags=flags)


def test_click_thresholds_are_three_ascending_scores_or_the_models_own() -> None:
    assert Settings.load(flags={"click_thresholds": "0.5, 1, 2.5"}).click_thresholds == (0.5, 1.0, 2.5)
    assert Settings.load().click_thresholds == ()


def test_the_namespace_is_the_group_id_unless_set() -> None:
    assert Settings.load(flags={"group_id": "ranker-eval"}).key_namespace == "ranker-eval"
    assert Settings.load(flags={"group_id": "ranker-eval", "namespace": "shared"}).key_namespace == "shared"


def test_the_metric_configuration_names_what_the_numbers_mean() -> None:
    config = Settings.load(flags={"k": "3,10", "gain": "linear", "windows": "5m,1h"}).metric_config
    assert config == {"k": [3, 10], "gain": "linear", "ideal": "pool", "bucket": 60_000,
                      "windows": [300_000, 3_600_000], "segment_labels": ["variant"],
                      "judgment_sources": ["raters", "coec", "sdbn"]}


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


@pytest.mark.parametrize(("argv", "environ", "expected"), [
    (["--windows=-5m"], {}, "setting windows (from --windows): '-5m' is not a duration (examples: 500ms"),
    ([], {"STREAM_NDCG_BATCH_SIZE": "abc"},
     "setting batch_size (from STREAM_NDCG_BATCH_SIZE): 'abc' is not an integer"),
    (["--log-level", "VERBOSE"], {}, "setting log_level (from --log-level): 'VERBOSE' is not one of DEBUG, INFO,"),
    (["--redis-url", "redis://host:notaport/0"], {},
     "setting redis_url (from --redis-url): 'redis://host:notaport/0' is not redis://[user:password@]host[:port]"),
    (["--bootstrap-servers", "not a url"], {},
     "setting bootstrap_servers (from --bootstrap-servers): 'not a url' is not host:port (example: kafka-0:9092"),
    (["--metrics-port", "70000"], {}, "setting metrics_port (from --metrics-port): 70000 is out of range: it must be "
     "between 1 and 65535"),
    (["--windows", "90s", "--bucket", "1m"], {}, "setting windows (from --windows): each window must be a whole "
     "number of buckets: 90s with bucket 1m"),
    (["--topics", "a,b", "--dead-letter-topic", "b"], {}, "setting dead_letter_topic (from --dead-letter-topic): "
     "'b' is an input topic"),
    (["--security-protocol", "SASL_SSL"], {}, "setting sasl_mechanism (default): needed with SASL_SSL: one of PLAIN"),
])
def test_a_wrong_value_is_named_with_its_setting_and_source(
        argv: list[str], environ: dict[str, str], expected: str,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main(["check-config", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"stream-ndcg: configuration error: {expected}" in captured.err


def test_a_wrong_redis_url_is_shown_without_its_password() -> None:
    with pytest.raises(ConfigError) as error:
        Settings.load(environ={"STREAM_NDCG_REDIS_URL": "redis://svc:hunter2@redis:6379/zero"})
    assert "hunter2" not in str(error.value)
    assert "setting redis_url (from STREAM_NDCG_REDIS_URL): 'redis://svc:***@redis:6379/zero'" in str(error.value)


@pytest.mark.parametrize(("line", "expected"), [
    ("metrics_port = true", "setting metrics_port (from {path}): True is not an integer"),
    ("metrics_port = 9464.5", "setting metrics_port (from {path}): 9464.5 is not an integer"),
    ("group_id = 7", "setting group_id (from {path}): 7 is not a string (quote it in a TOML file)"),
    ("batchsize = 7", "config file {path}: unknown key(s) batchsize (did you mean: batchsize -> batch_size?)"),
    ('log_level = "INFO"\n[stream_ndcg]\nbatch_size = 7',
     "config file {path}: keys at top level (log_level) beside a [stream_ndcg] table would be ignored"),
    ("stream_ndcg = 3", "config file {path}: stream_ndcg must be a table of settings"),
])
def test_a_toml_file_is_checked_key_by_key(tmp_path: Path, line: str, expected: str) -> None:
    path = tmp_path / "settings.toml"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError) as error:
        Settings.load(config_file=str(path))
    assert expected.format(path=path) in str(error.value)


def test_a_toml_file_holds_native_types_under_a_table_or_at_top_level(tmp_path: Path) -> None:
    for text in ("metrics_port = 9000\nrequire_key = false\nlinger = 250\n",
                 "[stream_ndcg]\nmetrics_port = 9000\nrequire_key = false\nlinger = '250ms'\n"):
        path = tmp_path / "settings.toml"
        path.write_text(text)
        settings = Settings.load(config_file=str(path))
        assert (settings.metrics_port, settings.require_key, settings.linger) == (9000, False, 250)


def test_constructing_settings_parses_and_checks_every_field() -> None:
    settings = Settings(log_level="debug", batch_size="20", windows="1m,5m")  # type: ignore[arg-type]
    assert (settings.log_level, settings.batch_size, settings.windows) == ("DEBUG", 20, (60_000, 300_000))
    with pytest.raises(ConfigError, match="setting batch_size: 0 is out of range: it must be at least 1"):
        Settings(batch_size=0)


def test_the_configuration_page_lists_every_declared_setting_with_its_default() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert markdown_table() in page, \
        "regenerate the table of docs/configuration.md: python -m stream_ndcg.setting_flags"
    rows = [line for line in page.splitlines() if line.startswith("| `") and line.count("|") == 4]
    table = markdown_table().splitlines()[2:]
    documented = [row.split("`")[1] for row in rows if row in table]
    assert documented == Settings.names()
    assert "| `windows` | `5m,1h,1d` |" in page
    assert "| `namespace` | (the group id) |" in page


def test_help_gives_every_setting_its_meaning_default_and_variable(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: argparse wraps at hyphens otherwise
    for command in ("run", "check-config"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for name in Settings.names():
            assert f"--{name.replace('_', '-')} {Settings.specs()[name].metavar} {help_line(name)}" in text, name
    assert help_line("log_level") == ("lowest level logged (any case); default INFO; one of DEBUG, INFO, WARNING, "
                                      "ERROR, CRITICAL; env STREAM_NDCG_LOG_LEVEL")
    assert help_line("linger") == "longest wait for a batch; default 100ms; env STREAM_NDCG_LINGER"


def test_simulate_takes_the_kafka_settings_of_run_from_the_same_declaration(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in Settings.kafka_names():
        assert f"--{name.replace('_', '-')} {Settings.specs()[name].metavar} {help_line(name)}" in text, name
    assert "--redis-url" not in text
    # Settings simulate does not use cannot stop it; its own are checked before any connection.
    monkeypatch.setenv("STREAM_NDCG_BATCH_SIZE", "abc")
    monkeypatch.setenv("STREAM_NDCG_SASL_MECHANISM", "PLAIN")
    assert main(["simulate", "--events", "1", "--security-protocol", "SASL_SSL"]) == 2
    assert ("configuration error: setting sasl_username (default): SASL_SSL needs sasl_username and sasl_password"
            in capsys.readouterr().err)


def test_a_control_names_a_value_of_an_exported_label_and_alpha_is_a_probability() -> None:
    settings = Settings(control=" variant = A ", alpha="0.01", n_star="5000")  # type: ignore[arg-type]
    assert (settings.control, settings.alpha, settings.n_star) == ("variant=A", 0.01, 5000)
    with pytest.raises(ConfigError, match="setting control: 'engine=x': its label is not one of segment_labels"):
        Settings(control="engine=x")
    with pytest.raises(ConfigError, match="setting control: 'A' is not label=value"):
        Settings(control="A")
    for alpha in (0, 1, "x"):
        with pytest.raises(ConfigError, match="setting alpha"):
            Settings(alpha=alpha)  # type: ignore[arg-type]
