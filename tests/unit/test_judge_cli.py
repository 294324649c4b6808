"""`stream-ndcg judge` with a wrong setting says which one, and where its value came from, before
it reaches for Kafka or Redis."""

from __future__ import annotations

import pytest

from stream_ndcg.cli import main


@pytest.mark.parametrize(("flags", "said"), [
    (["--judge-idle", "soon"], "setting judge_idle (from --judge-idle)"),
    (["--click-thresholds", "2,1,0"], "setting click_thresholds (from --click-thresholds)"),
    (["--click-model", "ctr"], "setting click_model (from --click-model)"),
])
def test_a_wrong_setting_is_named(flags: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["judge", *flags]) == 2
    assert said in capsys.readouterr().err


def test_a_wrong_variable_is_named(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STREAM_NDCG_JUDGE_GROUP_ID", "two words")
    assert main(["judge"]) == 2
    assert "setting judge_group_id (from STREAM_NDCG_JUDGE_GROUP_ID)" in capsys.readouterr().err
