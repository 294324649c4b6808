"""`stream-ndcg judgments export`: the judge's current click judgments, read from its store, as
JSON lines or TREC qrels, for trec_eval, pytrec_eval or ranx.

It reads the state `stream-ndcg judge` keeps in Redis under `key_namespace`, with the settings of
`judge` (the same flags, `STREAM_NDCG_*` variables and `--config`), and writes every (query,
document) pair that holds a grade from clicks now, sorted by query and document:

- `jsonl`: each pair's judgment event as the judge last published it (`type`, `query_id`,
  `doc_id`, `grade`, `ts` = the boundary it was decided at, `event_id`, `source` = the click
  model, `evidence`), so a line is also an event `run` or `replay` reads;
- `qrels`: `query_id 0 doc_id relevance`, TREC's four columns. trec_eval reads relevance as an
  integer (pytrec_eval requires one): grades 0-3 (`click_grade = thresholds`) are written as they
  are, a score grade (`click_grade = score`) rounded to the nearest integer, halves up. Columns
  are split on whitespace, so whitespace and `%` in an id are percent-encoded (`red shoes` ->
  `red%20shoes`): name the run's queries and documents the same way (`qrels_id`).

Pairs without a grade (fewer than `click_min_impressions` impressions in `click_horizon`, or
retracted) are omitted, in both formats: trec_eval counts a document absent from the qrels as
not relevant, and ranx likewise.

    stream-ndcg judgments export --format qrels --redis-url redis://redis:6379/0 > clicks.qrels
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from stream_ndcg.click_models import model_of_evidence
from stream_ndcg.errors import ConfigError, StoreUnavailable
from stream_ndcg.state import judge_format
from stream_ndcg.state.judge_store import Given, JudgeStore

if TYPE_CHECKING:
    from stream_ndcg.config import Settings

FORMATS = ("jsonl", "qrels")
_QUOTED = re.compile(r"[\s%]")


class NoJudgeState(Exception):
    """No judge has kept state in the store's namespace."""


def current(store: JudgeStore, model: str) -> list[dict[str, Any]]:
    """Every pair's judgment as last published, sorted by query and document. NoJudgeState if no
    judge recorded its format here; ConfigError if the state is of another format or another model."""
    found = store.recorded_format()
    if found is None:
        raise NoJudgeState("no judge state here")
    judge_format.check_judge_format(found)
    latest: dict[tuple[str, str], Given] = {}
    for partition in store.partitions():
        for pair, given in store.graded(partition).items():
            # A pair held by two partitions (the input topic was given more partitions): the later grade.
            if pair not in latest or given.ts > latest[pair].ts:
                latest[pair] = given
    judgments = []
    for (query_id, doc_id), given in sorted(latest.items()):
        if (found_model := model_of_evidence(given.evidence)) != model:
            raise ConfigError(f"the judge's state holds {found_model} judgments and click_model is {model}: export "
                              "with the settings of the judge that wrote them")
        judgments.append({"type": "judgment", "query_id": query_id, "doc_id": doc_id, "grade": given.grade,
                          "ts": given.ts, "event_id": f"{model}@{given.ts}", "source": model,
                          "evidence": given.evidence})
    return judgments


def qrels_id(text: str) -> str:
    """An id as a qrels column: whitespace and '%' percent-encoded (UTF-8), the rest as it is."""
    return _QUOTED.sub(lambda m: "".join(f"%{byte:02X}" for byte in m.group().encode()), text)


def relevance(grade: float) -> int:
    """A grade as qrels' integer relevance: whole grades as they are, others rounded, halves up."""
    return math.floor(grade + 0.5)


def lines(judgments: list[dict[str, Any]], form: str) -> Iterator[bytes]:
    for judgment in judgments:
        if form == "jsonl":
            yield orjson.dumps(judgment) + b"\n"
        else:
            yield (f"{qrels_id(judgment['query_id'])} 0 {qrels_id(judgment['doc_id'])} "
                   f"{relevance(judgment['grade'])}\n").encode()


def add_parser(sub: Any, add_settings: Callable[[argparse.ArgumentParser], None],
               settings_of: Callable[[argparse.Namespace], Settings]) -> None:
    """`judgments export` under the command's subparsers, with the settings' flags (`add_settings`)
    read by `settings_of`."""
    judgments = sub.add_parser("judgments", help="the judge's click judgments, read from Redis")
    actions = judgments.add_subparsers(dest="action", required=True)
    export = actions.add_parser("export", help="write the current click judgments as JSON lines or TREC qrels, "
                                               "with the settings of judge")
    export.add_argument("--format", default="jsonl", choices=FORMATS,
                        help="jsonl: each pair's judgment event as last published; qrels: 'query_id 0 doc_id "
                             "relevance', score grades rounded to integers, ids' whitespace and %% "
                             "percent-encoded (default jsonl)")
    export.add_argument("--output", metavar="FILE", help="write here instead of stdout (written only on success)")
    export.add_argument("--config", metavar="FILE.toml", help="TOML settings file; env STREAM_NDCG_CONFIG")
    add_settings(export)

    def handler(args: argparse.Namespace) -> int:
        from stream_ndcg import wiring

        settings = settings_of(args)
        return run(wiring.judge_store(settings), settings.click_model, settings.key_namespace, args.format,
                   args.output)

    export.set_defaults(handler=handler)


def run(store: JudgeStore, model: str, namespace: str, form: str, output: str | None) -> int:
    """`judgments export` once its settings are read: 0, or 1 with the reason on stderr."""
    try:
        judgments = current(store, model)
    except StoreUnavailable as exc:
        print(f"stream-ndcg judgments export: cannot read the judge's state: {exc}", file=sys.stderr)
        return 1
    except NoJudgeState:
        print(f"stream-ndcg judgments export: no judge state under namespace {namespace!r}: is `stream-ndcg "
              "judge` running with these redis_url and key_namespace settings?", file=sys.stderr)
        return 1
    if output is None:
        sys.stdout.buffer.writelines(lines(judgments, form))
        sys.stdout.buffer.flush()
    else:
        with open(output, "wb") as out:
            out.writelines(lines(judgments, form))
    print(f"{len(judgments)} judgment(s) of {model}", file=sys.stderr)
    return 0
