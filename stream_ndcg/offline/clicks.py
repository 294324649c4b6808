"""`stream-ndcg replay --click-model`: the replay's flags for judgments from clicks, and the judge they build.

The click models' settings are the service's (`config.Settings`, declared once):
`--click-horizon`, `--click-bucket`, `--click-max-rank`, `--click-min-impressions`,
`--click-session`, `--judge-interval`, `--click-grade` and `--click-thresholds`, with
`--dedup-horizon` for how long an impression id is remembered. `--judgments-out`
writes every judgment decided, as the judge would publish it, one JSON object a line.

    judge = click_judge_of(args)            # None without --click-model
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TextIO

from stream_ndcg import wiring
from stream_ndcg.click_judge import ClickJudge, ClickJudgment
from stream_ndcg.click_models import MODELS
from stream_ndcg.config import Settings, flag_name
from stream_ndcg.errors import ConfigError
from stream_ndcg.setting_flags import add_setting_flags

# The settings of the click models a replay takes (`click_model` is --click-model's own flag:
# without it the replay scores with the files' judgments).
CLICK_SETTINGS = ("click_horizon", "click_bucket", "click_max_rank", "click_min_impressions", "click_session",
                  "judge_interval", "click_grade", "click_thresholds")


def add_click_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "judgments from clicks",
        "derive the judgments from the files' impressions and clicks at every --judge-interval boundary of "
        "their clock, as `judge` would on one partition with the event clock, and score with those (the "
        "files' judgment events are set aside)")
    group.add_argument("--click-model", choices=MODELS,
                       help="the click model: coec (clicks over expected clicks) or sdbn (a cascade model)")
    group.add_argument("--judgments-out", metavar="OUT.jsonl",
                       help="write every judgment decided from clicks, one JSON object a line, with its "
                            "source and evidence")
    add_setting_flags(group, CLICK_SETTINGS, variables=False)


def click_judge_of(args: argparse.Namespace, dedup_horizon: str | None) -> ClickJudge | None:
    """The judge the flags ask for, None without --click-model; ConfigError if a click flag is given
    without it, a value is invalid, or --judgments-out's directory does not exist."""
    given = [name for name in (*CLICK_SETTINGS, "judgments_out") if getattr(args, name) is not None]
    if args.click_model is None:
        if given:
            raise ConfigError(f"{flag_name(given[0])} only applies with --click-model")
        return None
    if args.judgments_out is not None:
        directory = os.path.dirname(os.path.abspath(args.judgments_out))
        if not os.path.isdir(directory):
            raise ConfigError(f"--judgments-out: directory {directory} does not exist")
    flags = {name: getattr(args, name) for name in CLICK_SETTINGS}
    return wiring.click_judge(Settings.load(flags={**flags, "click_model": args.click_model,
                                                   "dedup_horizon": dedup_horizon}))


class JudgmentWriter:
    """Writes each judgment from clicks as the judge publishes it, one JSON object a line."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.written = 0

    def __call__(self, judgment: ClickJudgment) -> None:
        self.out.write(json.dumps(judgment.message()) + "\n")
        self.written += 1
