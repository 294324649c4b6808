"""Where the service's CPU goes while it catches up: py-spy's samples of `stream-ndcg run`.

    python -m bench.profile_bench [--events 500000] [--seconds 30] [--after 0] [--native] [--results bench/RESULTS.md]

Starts a Kafka broker and a redis-server, produces the service bench's workload, and samples the
service on its pure-Python core (py-spy, 100 a second, busy samples only) once it has taken in
`--after` events (its first batch by default): late in a long catch-up is where the states the
batches touch have outgrown the state cache. `--native` samples the compiled core instead, with
py-spy's native frames, where a compiled function shows by its C name. Writes
the share of the samples in each step of a batch and the functions with the most samples of their
own to the Profile section of RESULTS.md, and the raw stacks next to it (`--raw`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import redis

from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import kafka_and_redis
from bench.harness.service_process import ServiceProcess, counted
from bench.harness.workloads import create_topic, workload
from stream_ndcg.devtools.producer import produce

# A sample belongs to the first step whose frame its stack holds (the steps do not nest).
STEPS = (
    ("Kafka poll", "KafkaSource.poll"),
    ("parse", "BatchPipeline.parse"),
    ("load", "RedisStore.load"),
    ("engine", "Engine.apply"),
    ("commit payload", "RedisStore._payload"),
    # The wait for the commit's replies: after the next poll, or at once after a smaller batch.
    ("commit reply", "_RedisCommit.finish"),
)
TOP_FUNCTIONS = 15


def _native_name(frame: str) -> str:
    """How mypyc names a compiled method in its C symbols (`Engine.apply`: `..._Engine___apply`)."""
    return frame.replace(".", "___")


def _project_function(frames: list[str]) -> str:
    """The innermost frame of stream-ndcg's own code, Python or compiled (mypyc's `CPyDef_`
    functions): under --native the innermost frame is mostly CPython's or the C library's."""
    for frame in reversed(frames):
        function, _, where = frame.partition(" (")
        if where.startswith("stream_ndcg/"):
            return f"{function} ({where.split(':')[0]})"
        # mypyc's own helpers (a native object's clear and set-up for the collector) are not the
        # project's functions: the frame outside them is. The compiled modules are all top-level.
        if function.startswith("CPyDef_") and "__mypyc__" not in function \
                and not function.endswith(("_clear", "_setup")):
            module, _, name = function.removeprefix("CPyDef_").partition("___")
            return f"{name.replace('___', '.')} (stream_ndcg/{module}.py, compiled)"
    return "none"


def profile(raw_stacks: str) -> tuple[int, Counter[str], Counter[str], Counter[str]]:
    """Samples in all, per step, per function of their own (the innermost frame) and per innermost
    function of the project's code, from py-spy's raw output: one stack a line, frames joined by
    ';', then the count."""
    steps: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    project: Counter[str] = Counter()
    total = 0
    for line in raw_stacks.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        samples = int(count)
        total += samples
        step = next((name for name, frame in STEPS if frame in stack or _native_name(frame) in stack), "other")
        steps[step] += samples
        frames = stack.split(";")
        function, _, where = frames[-1].partition(" (")
        # A native frame has no line: "poll (libc.so.6)".
        functions[f"{function} ({where.rstrip(')').split(':')[0]})"] += samples
        project[_project_function(frames)] += samples
    return total, steps, functions, project


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--after", type=int, default=0, help="start sampling once the service took in this many events")
    parser.add_argument("--native", action="store_true", help="sample the compiled core, with native frames")
    parser.add_argument("--raw", type=Path, default=None, help="keep py-spy's raw stacks in this file")
    args = parser.parse_args()
    if args.after >= args.events:
        parser.error(f"--after {args.after} leaves none of the {args.events} events to sample")
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with kafka_and_redis("profile") as (kafka, server), \
            tempfile.TemporaryDirectory(prefix="stream-ndcg-profile-stacks-") as root:
        topic = create_topic(kafka.bootstrap, "profile")
        messages = workload(args.events, seed=1)
        produce(kafka.bootstrap, topic, messages)
        client = redis.Redis.from_url(server.url)
        # By default the pure core: py-spy reads Python's frames, and a compiled module's functions
        # have none (only native frames, which --native unwinds).
        core = {} if args.native else {"pure": "1"}
        service = ServiceProcess(kafka.bootstrap, server.url, topic, "profile", clock="event", **core)
        raw = Path(root, "stacks.txt")
        try:
            while counted(client, "profile") <= args.after:
                if service.process.poll() is not None:
                    raise RuntimeError(f"the service exited before it took in {args.after:,} events; see {service.log}")
                time.sleep(0.05)
            subprocess.run([spy, "record", "--pid", str(service.process.pid), "--rate", "100", "--duration",
                            str(args.seconds), "--format", "raw", "--output", str(raw),
                            # py-spy unwinds native frames only with the process stopped at each sample.
                            *(["--native"] if args.native else ["--nonblocking"])],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            taken = counted(client, "profile")
        finally:
            service.stop()
            client.close()
        if taken >= len(messages):
            print(f"the catch-up ended within the {args.seconds} s sampled: give it more --events", file=sys.stderr)
            return 1
        text = raw.read_text()
        if args.raw:
            args.raw.write_text(text)
    total, steps, functions, project = profile(text)
    lines = [
        "## Profile",
        "",
        f"`{command(__file__)}`, {stamp()}: `py-spy record --rate 100 --format raw "
        f"{'--native' if args.native else '--nonblocking'}` on `stream-ndcg run` ("
        f"{'its compiled core' if args.native else 'its pure-Python core, `STREAM_NDCG_PURE=1`'}) for "
        f"{args.seconds} s of a catch-up of {args.events:,} events (the service bench's workload), from "
        f"{f'when it had taken in {args.after:,}' if args.after else 'its first commit'}; {total:,} busy samples (idle "
        "ones are not taken).",
        "",
        "| step of a batch | share of the samples |",
        "|---|---:|",
        *[f"| {name} | {100 * count / total:.1f}% |" for name, count in steps.most_common()],
        "",
        f"Functions with the most samples of their own (the top {TOP_FUNCTIONS}):",
        "",
        "| function (module) | share |",
        "|---|---:|",
        *[f"| `{name}` | {100 * count / total:.1f}% |" for name, count in functions.most_common(TOP_FUNCTIONS)],
        "",
        f"The same samples by the innermost function of stream-ndcg's own code (the top {TOP_FUNCTIONS}):",
        "",
        "| function (module) | share |",
        "|---|---:|",
        *[f"| `{name}` | {100 * count / total:.1f}% |" for name, count in project.most_common(TOP_FUNCTIONS)],
        "",
    ]
    return publish(args.results, "\n".join(lines), {
        "bench": "profile", "samples": total,
        "steps": {name: round(count / total, 3) for name, count in steps.most_common()}})


if __name__ == "__main__":
    sys.exit(main())
