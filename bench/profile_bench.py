"""Where the service's CPU goes while it catches up: py-spy's samples of `stream-ndcg run`.

    python -m bench.profile_bench [--events 500000] [--seconds 30] [--results bench/RESULTS.md]

Starts a Kafka broker and a redis-server, produces the service bench's workload, and samples the
service on its pure-Python core (py-spy, 100 a second, busy samples only) once it has committed its first batch. Writes
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


def profile(raw_stacks: str) -> tuple[int, Counter[str], Counter[str]]:
    """Samples in all, per step, and per function of their own (the innermost frame), from py-spy's
    raw output: one stack a line, frames joined by ';', then the count."""
    steps: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    total = 0
    for line in raw_stacks.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        samples = int(count)
        total += samples
        steps[next((name for name, frame in STEPS if frame in stack), "other")] += samples
        function, _, where = stack.split(";")[-1].partition(" (")
        functions[f"{function} ({where.split(':')[0]})"] += samples
    return total, steps, functions


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--raw", type=Path, default=None, help="keep py-spy's raw stacks in this file")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with kafka_and_redis("profile") as (kafka, server), \
            tempfile.TemporaryDirectory(prefix="stream-ndcg-profile-stacks-") as root:
        topic = create_topic(kafka.bootstrap, "profile")
        messages = workload(args.events, seed=1)
        produce(kafka.bootstrap, topic, messages)
        client = redis.Redis.from_url(server.url)
        # The pure core: py-spy reads Python's frames, and a compiled module's functions have none.
        service = ServiceProcess(kafka.bootstrap, server.url, topic, "profile", clock="event", pure="1")
        raw = Path(root, "stacks.txt")
        try:
            while not counted(client, "profile"):
                time.sleep(0.05)
            subprocess.run([spy, "record", "--pid", str(service.process.pid), "--rate", "100", "--duration",
                            str(args.seconds), "--format", "raw", "--output", str(raw), "--nonblocking"],
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
    total, steps, functions = profile(text)
    lines = [
        "## Profile",
        "",
        f"`{command(__file__)}`, {stamp()}: `py-spy record --rate 100 --format raw "
        f"--nonblocking` on `stream-ndcg run` (its pure-Python core, `STREAM_NDCG_PURE=1`) for "
        f"{args.seconds} s of a catch-up of {args.events:,} events (the service bench's workload), from its "
        f"first commit; {total:,} busy samples (idle ones are not taken).",
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
    ]
    return publish(args.results, "\n".join(lines), {
        "bench": "profile", "samples": total,
        "steps": {name: round(count / total, 3) for name, count in steps.most_common()}})


if __name__ == "__main__":
    sys.exit(main())
