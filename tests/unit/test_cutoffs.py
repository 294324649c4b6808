"""The cut-offs k: one parser and one default for settings, flags and the replay command."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_ndcg.cli import build_parser, main
from stream_ndcg.config import Settings
from stream_ndcg.errors import ConfigError
from stream_ndcg.exporter import WindowView
from stream_ndcg.metric import DEFAULT_CUTOFFS, Measure
from stream_ndcg.offline.history import settings_of
from stream_ndcg.setting_values import parse_cutoffs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "events.jsonl"


@pytest.mark.parametrize("value", ["5,10", " 5 , 10 ,", [5, 10], ["5", "10"]])
def test_cutoffs_parse_from_text_and_from_toml_arrays(value: object) -> None:
    assert parse_cutoffs(value) == (5, 10)


@pytest.mark.parametrize(("value", "message"), [("5,x", "comma-separated list of integers"),
                                                ("0", "positive"), ("5,5", "distinct"), ("", "at least one")])
def test_bad_cutoffs_say_why(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_cutoffs(value)
    with pytest.raises(ConfigError, match=message):
        Settings.load(flags={"k": value})


def test_every_default_is_the_measures() -> None:
    assert Measure().cutoffs == Settings().k == DEFAULT_CUTOFFS
    args = build_parser().parse_args(["replay", str(EXAMPLE)])
    assert settings_of(k=args.k).measure.cutoffs == DEFAULT_CUTOFFS


def test_the_replay_command_refuses_repeated_cutoffs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(EXAMPLE), "--k", "5,5"]) == 2
    assert "distinct" in capsys.readouterr().err


def test_the_exporter_reads_the_cutoffs_of_the_engines_measure() -> None:
    settings = Settings.load(flags={"k": "3,20", "windows": "5m,1h", "segment_labels": "variant,engine",
                                    "clock": "event"})
    assert WindowView.from_settings(settings) == WindowView(
        cutoffs=settings.measure.cutoffs, windows_ms=(300_000, 3_600_000), bucket_ms=60_000,
        segment_labels=("variant", "engine"), event_clock=True, pipeline="stream-ndcg")
    assert settings.measure.cutoffs == (3, 20)
