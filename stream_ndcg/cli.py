"""The `stream-ndcg` command: replay, run, judge, judgments, ubi-bridge, check-config and dev."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence

from stream_ndcg import __version__
from stream_ndcg.config import EPOCH_SECONDS_BELOW_MS, Settings, env_name
from stream_ndcg.core_build import core_build
from stream_ndcg.errors import ConfigError
from stream_ndcg.events import Limits
from stream_ndcg.judgments_export import add_parser as add_judgments_parser
from stream_ndcg.logs import configure_logging
from stream_ndcg.offline.clicks import JudgmentWriter, add_click_flags, click_judge_of
from stream_ndcg.offline.files import replay_files
from stream_ndcg.offline.history import add_history_flags, history_of, replay_labels, settings_of, write_history
from stream_ndcg.offline.replay import Replay
from stream_ndcg.setting_flags import add_setting_flags
from stream_ndcg.setting_values import format_duration, parse_cutoffs


def _cutoffs_flag(text: str) -> tuple[int, ...]:
    try:
        return parse_cutoffs(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_replay(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:
        return _replay(args, stack)


def _replay(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    history = history_of(args)
    judge = click_judge_of(args, args.dedup_horizon)
    # The service's settings the replay reads: the metric, the longest list, its dedup horizon
    # counted in its buckets, and the windows of --per-query; the labels it compares by (`replay_labels`).
    settings = settings_of(k=args.k, gain=args.gain, ideal=args.ideal, max_results=args.max_results,
                           bucket=args.bucket, windows=args.windows, dedup_horizon=args.dedup_horizon,
                           judgment_sources=args.judgment_sources, control=args.control, alpha=args.alpha,
                           n_star=args.n_star, experiments=args.experiments,
                           segment_labels=replay_labels(args.control, args.experiments))
    writer = (JudgmentWriter(stack.enter_context(open(args.judgments_out, "w", encoding="utf-8")))
              if args.judgments_out else None)
    replay = Replay(settings.measure, Limits(max_results=settings.max_results), tap=history.add if history else None,
                    dedup_horizon_ms=settings.dedup_horizon, bucket_ms=settings.bucket, click_judge=judge,
                    on_click_judgment=writer)
    per_query = settings if args.per_query else None
    for flag, path in (("--per-impression", args.per_impression), ("--per-query", args.per_query)):
        # Found out before the work, not after minutes of it.
        directory = os.path.dirname(os.path.abspath(path)) if path else ""
        if path and (not os.path.isdir(directory) or not os.access(directory, os.W_OK)):
            print(f"stream-ndcg replay: cannot write {flag} {path}: directory "
                  f"{directory} does not exist or is not writable (create it first)", file=sys.stderr)
            return 2
    status = 0 if replay_files(replay, args.files) else 1
    if replay.earliest_ts is not None and replay.earliest_ts < EPOCH_SECONDS_BELOW_MS:
        print(f"stream-ndcg replay: warning: event times as small as ts={replay.earliest_ts} fall before 1973 "
              "as epoch milliseconds: are they epoch seconds? The contract wants milliseconds (or RFC 3339); "
              "windows and horizons would be off by a factor of 1000", file=sys.stderr)
    if judge is not None and not judge.boundaries:
        print(f"stream-ndcg replay: warning: the events' clock passed no --judge-interval boundary "
              f"({format_duration(judge.settings.interval_ms)}): no judgment was decided from clicks", file=sys.stderr)
    if args.per_impression:
        with open(args.per_impression, "w", encoding="utf-8") as out:
            for record in replay.per_impression():
                out.write(json.dumps(record) + "\n")
    if per_query is not None:
        with open(args.per_query, "w", encoding="utf-8") as out:
            for record in replay.per_query(per_query.windows, per_query.bucket):
                out.write(json.dumps(record) + "\n")
    if history is not None:
        write_history(history, args.openmetrics)
    label, _, value = settings.control.partition("=")
    summary = replay.summary((label, value) if value else None, settings.alpha, settings.n_star, settings.experiments)
    sys.stdout.write(json.dumps(summary) + "\n")
    return status


def cmd_judging_queue(args: argparse.Namespace) -> int:
    from stream_ndcg.drilldown.api import judging_queue_body
    from stream_ndcg.drilldown.question import Question
    from stream_ndcg.errors import RequestError, StoreUnavailable
    from stream_ndcg.service import explorer

    settings = _settings(args)
    params: dict[str, list[str]] = {"limit": [args.limit], "format": [args.format]}
    if args.window:
        params["window"] = [args.window]
    if args.top_k:
        params["k"] = [args.top_k]
    for given in args.segment:
        label, sep, value = given.partition("=")
        if not sep:
            print(f"stream-ndcg judging-queue: --segment {given!r}: use LABEL=VALUE", file=sys.stderr)
            return 2
        params.setdefault(f"segment.{label}", []).append(value)
    reader = explorer(settings)
    try:
        question = Question.parse(params, reader.view, kind="judging-queue")
        _, body, _ = judging_queue_body(reader.judging_queue(question), question.format)
    except RequestError as exc:
        flag = {"k": "--top-k", "window": "--window", "limit": "--limit"}.get(exc.parameter, f"--{exc.parameter}")
        print(f"stream-ndcg judging-queue: {str(exc).replace(exc.parameter, flag, 1)}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:
        print(f"stream-ndcg judging-queue: {exc}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(body if body.endswith(b"\n") else body + b"\n")
    return 0


def _settings(args: argparse.Namespace) -> Settings:
    flags = {name: getattr(args, name, None) for name in Settings.names()}
    return Settings.load(flags=flags, environ=os.environ, config_file=args.config)


def _kafka_settings(args: argparse.Namespace) -> Settings:
    """The Kafka connection settings alone, from flags or variables: a tool that only produces
    should not fail on a Redis or metric setting it never uses."""
    names = Settings.kafka_names()
    environ = {env_name(name): os.environ[env_name(name)] for name in names if env_name(name) in os.environ}
    return Settings.load(flags={name: getattr(args, name, None) for name in names}, environ=environ)


def cmd_run(args: argparse.Namespace) -> int:
    from stream_ndcg import service

    settings = _settings(args)
    configure_logging(settings)
    return service.run(settings)


def cmd_ubi_bridge(args: argparse.Namespace) -> int:
    from stream_ndcg import ubi_bridge

    settings = _settings(args)
    configure_logging(settings)
    return ubi_bridge.run(settings)


def cmd_judge(args: argparse.Namespace) -> int:
    from stream_ndcg import judge_service

    settings = _settings(args)
    configure_logging(settings)
    return judge_service.run(settings)


def cmd_check_config(args: argparse.Namespace) -> int:
    settings = _settings(args)
    json.dump(settings.masked(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    status = 0
    if args.connect:
        from stream_ndcg import preflight

        # Reports go to stderr, so that stdout stays the JSON of the settings for scripts.
        problems = preflight.check(settings, report=lambda line: print(line, file=sys.stderr))
        for problem in problems:
            print(f"stream-ndcg check-config: {problem}", file=sys.stderr)
        status = 1 if problems else 0
    if args.state:
        status = max(status, _check_state(settings))
    return status


def _check_state(settings: Settings) -> int:
    """`check-config --state`: what `run` would do with the state stored in Redis; 2 if it would refuse it."""
    from stream_ndcg import reconfigure
    from stream_ndcg.errors import StoreUnavailable
    from stream_ndcg.state import format as state_format
    from stream_ndcg.wiring import redis_store

    store = redis_store(settings)
    try:
        stored, found_format = store.recorded_config()
    except StoreUnavailable as exc:
        print(f"stream-ndcg: cannot read the stored state: {exc}", file=sys.stderr)
        return 1
    print(f"namespace {settings.key_namespace}, format version {found_format or 1}", file=sys.stderr)
    state_format.check_format(found_format)
    text, starts = reconfigure.report(stored, reconfigure.configured(settings), rebuild=settings.rebuild)
    print(text, file=sys.stderr)
    return 0 if starts else 2


def cmd_dev(args: argparse.Namespace) -> int:
    from stream_ndcg.devtools import dev_stack

    if args.action == "up":
        if args.kafka_port and args.brokers > 1 or args.replicas and not args.redis_cluster:
            print("stream-ndcg dev up: --kafka-port goes with one broker, --replicas with --redis-cluster",
                  file=sys.stderr)
            return 2
        state = dev_stack.dev_up(args.kafka_port, args.redis_port, redis_cluster=args.redis_cluster,
                                 brokers=args.brokers, replicas=args.replicas)
        print(f"kafka  {state['bootstrap_servers']}  (STREAM_NDCG_BOOTSTRAP_SERVERS)")
        print(f"redis  {state['redis_url']}  (STREAM_NDCG_REDIS_URL)")
        if args.brokers > 1:
            print(f"       a KRaft cluster of {args.brokers} nodes, topics at replication {args.brokers}")
        if args.redis_cluster:
            print(f"       a cluster of 3 masters, {args.replicas} replica(s) each  (STREAM_NDCG_REDIS_CLUSTER=true)")
        print("stop both with: stream-ndcg dev down")
        return 0
    if not dev_stack.dev_down():
        print("nothing is up", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from stream_ndcg.devtools import demo

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    return demo.run(rate=args.rate, metrics_port=args.metrics_port, api_port=args.api_port)


def cmd_simulate(args: argparse.Namespace) -> int:
    from stream_ndcg.devtools.simulator import SimulationSpec, Simulator

    events = args.events if args.duration is None else int(args.duration * args.rate)
    spec = SimulationSpec(events=events, seed=args.seed, queries=args.queries, rate=args.rate,
                          malformed_share=args.malformed_share, max_delay_ms=args.max_delay_ms, clicks=args.clicks)
    messages = Simulator(spec).messages()
    if args.output:
        with open(args.output, "wb") as out:
            for _, value in messages:
                out.write(value.replace(b"\n", b" ") + b"\n")
        return 0
    from stream_ndcg.devtools.producer import BrokerUnreachable, produce

    settings = _kafka_settings(args)
    try:
        options = settings.kafka_client_options()
        del options["bootstrap_servers"]
        sent = produce(settings.bootstrap_servers, args.topic, messages, paced=args.paced, rate=args.rate, **options)
    except BrokerUnreachable as exc:
        print(f"stream-ndcg simulate: {exc}", file=sys.stderr)
        return 1
    print(f"sent {sent} messages to {args.topic}", file=sys.stderr)
    return 0


def _add_setting_flags(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    group = parser.add_argument_group("settings (flags win over environment variables, which win over --config)")
    add_setting_flags(group, names)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stream-ndcg", description="Streaming DCG/nDCG@k for search rankings.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}, {core_build().describe()}")
    sub = parser.add_subparsers(dest="command", required=True)
    replay = sub.add_parser("replay", help="compute the metrics from files of events, no servers")
    replay.add_argument("files", nargs="+", metavar="EVENTS.jsonl",
                        help="event files, one JSON object a line; - for stdin")
    # The service's settings of the same names: the replay computes what the service would.
    add_setting_flags(replay, ("k", "gain", "ideal", "judgment_sources", "max_results", "dedup_horizon", "control",
                               "alpha", "n_star", "experiments"), variables=False)
    replay.add_argument("--per-impression", metavar="OUT.jsonl", help="write one line of scores per impression")
    replay.add_argument("--per-query", metavar="OUT.jsonl",
                        help="write the drill-down's figures per window (--windows, --bucket; ending at the newest "
                             "event), query and segment")
    add_history_flags(replay)
    add_click_flags(replay)
    replay.set_defaults(handler=cmd_replay)

    handlers = {"run": cmd_run, "judge": cmd_judge, "check-config": cmd_check_config}
    for name, help_text in (("run", "consume from Kafka, keep state in Redis, serve Prometheus metrics"),
                            ("judge", "derive judgments from impressions and clicks, publish them to a topic for run"),
                            ("check-config", "validate and print the effective configuration, secrets masked")):
        command = sub.add_parser(name, help=help_text)
        command.add_argument("--config", metavar="FILE.toml",
                             help="TOML settings file, keys at top level or under [stream_ndcg]; "
                                  "env STREAM_NDCG_CONFIG")
        if name == "check-config":
            command.add_argument("--connect", action="store_true",
                                 help="also reach Kafka and Redis with these settings: check the topics and "
                                      "their partitions, and exit 1 if something is unreachable or missing")
        _add_setting_flags(command, Settings.names())
        command.set_defaults(handler=handlers[name])
        if name == "check-config":
            command.add_argument("--state", action="store_true",
                                 help="also read the metric configuration stored in Redis (redis_url, namespace) "
                                      "and say whether this configuration continues it, changes it in place or "
                                      "needs a rebuild (exit 2 if run would refuse it)")

    add_judgments_parser(sub, lambda command: _add_setting_flags(command, Settings.names()), _settings)
    bridge = sub.add_parser("ubi-bridge", help="join OpenSearch UBI queries and events (ubi_*_topic) into the "
                                               "contract's impressions and clicks, keyed by the query text")
    bridge.add_argument("--config", metavar="FILE.toml", help="TOML settings file; env STREAM_NDCG_CONFIG")
    _add_setting_flags(bridge, Settings.names())
    bridge.set_defaults(handler=cmd_ubi_bridge)

    queue = sub.add_parser("judging-queue", help="the unjudged (query, document) pairs of most top-k exposure, "
                                                 "read from Redis: what raters should judge first")
    queue.add_argument("--window", help="a configured window (default: the first)")
    queue.add_argument("--top-k", dest="top_k", metavar="K", help="a configured cut-off (default: the largest)")
    queue.add_argument("--segment", action="append", default=[], metavar="LABEL=VALUE",
                       help="only impressions of this segment value; repeatable")
    queue.add_argument("--limit", default="100", help="pairs to list (default 100, at most 10000)")
    queue.add_argument("--format", default="csv", choices=("json", "jsonl", "csv"), help="output (default csv)")
    queue.add_argument("--config", metavar="FILE.toml", help="TOML settings file; env STREAM_NDCG_CONFIG")
    _add_setting_flags(queue, Settings.names())
    queue.set_defaults(handler=cmd_judging_queue)

    dev = sub.add_parser("dev", help="start or stop a local Kafka broker and redis-server on loopback")
    dev.add_argument("action", choices=("up", "down"))
    dev.add_argument("--kafka-port", type=int)
    dev.add_argument("--redis-port", type=int, help="the port of the one Redis server (not with --redis-cluster)")
    dev.add_argument("--redis-cluster", action="store_true", help="a Redis Cluster of three masters instead")
    dev.add_argument("--brokers", type=int, choices=(1, 3), default=1,
                     help="Kafka nodes: 1, or a KRaft cluster of 3 (every topic at replication 3, min.insync 2)")
    dev.add_argument("--replicas", type=int, choices=(0, 1), default=0,
                     help="replicas of each Redis Cluster master (with --redis-cluster)")
    dev.set_defaults(handler=cmd_dev)

    demo = sub.add_parser("demo", help="Kafka, Redis, the service and simulated traffic, with a live view")
    demo.add_argument("--rate", type=float, default=300.0, help="events per second")
    demo.add_argument("--metrics-port", type=int, default=9464)
    demo.add_argument("--api-port", type=int, default=9465, help="the drill-down page's port (default 9465)")
    demo.set_defaults(handler=cmd_demo)

    simulate = sub.add_parser("simulate", help="generate realistic traffic to Kafka or to a JSONL file")
    simulate.add_argument("--events", type=int, default=10_000, help="how many messages (default 10000)")
    simulate.add_argument("--duration", type=float, help="seconds of traffic at --rate (instead of --events)")
    simulate.add_argument("--max-delay-ms", type=int, default=3_600_000,
                          help="longest delay of a judgment after its impression, in event time")
    simulate.add_argument("--seed", type=int, default=1)
    simulate.add_argument("--queries", type=int, default=1_000)
    simulate.add_argument("--rate", type=float, default=1_000.0, help="events per second of event time")
    simulate.add_argument("--malformed-share", type=float, default=0.0)
    simulate.add_argument("--clicks", action="store_true",
                          help="users click too, by a position-based model of the documents' hidden true grades")
    simulate.add_argument("--output", metavar="FILE.jsonl", help="write to a file instead of Kafka")
    simulate.add_argument("--topic", default="search-events")
    _add_setting_flags(simulate, Settings.kafka_names())
    simulate.add_argument("--paced", action="store_true", help="send at --rate in real time")
    simulate.set_defaults(handler=cmd_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except ConfigError as exc:
        print(f"stream-ndcg: configuration error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`stream-ndcg replay f.jsonl | head -1`): end quietly, as `cat`
        # does. Point stdout at /dev/null so that the flush at exit does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # killed by SIGPIPE, as a shell reports it
    return status


if __name__ == "__main__":
    sys.exit(main())
