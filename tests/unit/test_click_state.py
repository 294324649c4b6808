"""A click judge saved and loaded at any point goes on as if it had never been: its state as plain
data (`click_state`), whole or as the changes of each commit merged into what was stored, and
through the stored form of `state.judge_format`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stream_ndcg.click_judge import ClickJudge, ClickJudgment, JudgeSettings
from stream_ndcg.click_models import Grading
from stream_ndcg.click_state import JudgeState, merged
from stream_ndcg.state import judge_format
from tests.unit.test_click_properties import BUCKET, HORIZON, INTERVAL, MAX_RANK, SESSION, Event, blocks, gradings


def settings_of(grading: Grading) -> JudgeSettings:
    return JudgeSettings(grading, horizon_ms=HORIZON, bucket_ms=BUCKET, max_rank=MAX_RANK, session_ms=SESSION,
                         interval_ms=INTERVAL, dedup_ms=INTERVAL)


def stored_form(state: JudgeState) -> JudgeState:
    """`state` written as a store's hash fields and read back."""
    return judge_format.state_of_fields(judge_format.fields_of_state(state))


@given(blocks(), gradings, st.data())
def test_a_judge_saved_and_loaded_anywhere_emits_what_one_never_saved_emits(
        events: list[list[Event]], grading: Grading, data: st.DataObject) -> None:
    settings = settings_of(grading)
    stream = [event for block in events for event in block]
    never_saved = ClickJudge(settings)
    expected = [j for event in stream for j in never_saved.add(event)]
    saves = data.draw(st.sets(st.integers(0, len(stream))))
    whole = data.draw(st.booleans())
    judge = ClickJudge(settings)
    stored = JudgeState()
    got: list[ClickJudgment] = []
    for index, event in enumerate(stream):
        if index in saves:
            # Whole, or as a store keeps it: the changes of each commit merged into what it holds.
            stored = judge.state() if whole else merged(stored, judge.changes())
            judge = ClickJudge.from_state(settings, stored_form(stored))
        elif not whole:
            stored = merged(stored, judge.changes())
        got.extend(judge.add(event))
    assert got == expected
    assert judge.summary() == never_saved.summary()
    assert stored_form(merged(stored, judge.changes())) == stored_form(never_saved.state())


@given(blocks(), gradings)
def test_the_changes_merged_are_the_whole_state(events: list[list[Event]], grading: Grading) -> None:
    judge = ClickJudge(settings_of(grading))
    stored = JudgeState()
    for event in (e for block in events for e in block):
        judge.add(event)
        stored = merged(stored, judge.changes())
        assert stored == judge.state()
