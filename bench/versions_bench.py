"""The batch pipeline's throughput, this tree's package against another commit's, runs alternated.

    python -m bench.versions_bench [--against COMMIT] [--events 100000] [--rounds 3] [--ideal pool|list]

Extracts the package of `--against` from git (no work tree, no repository change), starts one
redis-server, and writes the same workload (the service bench's) through each version's batch
pipeline (`harness.pipeline.Writer`: parse, load, engine, commit, on real Redis, without Kafka),
each run in a process of its own on a namespace of its own, the versions alternated round after
round so that a machine shared with other work weighs on both alike. Reports each version's
median events per second and their ratio, in the "## Versions" section of RESULTS.md. The
default commit is the last one that wrote state format 4: what keeping the sums of squares
(format 5) costs.
"""

from __future__ import annotations

import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.harness.results import argument_parser, command, publish, stamp
from bench.harness.servers import redis_server
from bench.harness.workloads import workload

ROOT = Path(__file__).resolve().parents[1]
# The last commit that wrote state format 4 (before the sums of squares, #29).
FORMAT_4 = "5446c1c7fb40094b1c6418e6e5e81d037227207d"


def package_of(commit: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, "stream_ndcg"],
                             capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def child(url: str, namespace: str, messages_file: Path, ideal: str) -> None:
    """One run: every message through the pipeline; prints events per second."""
    from bench.harness.pipeline import Writer
    from stream_ndcg.config import Settings

    messages = messages_file.read_bytes().splitlines()
    settings = Settings.load(environ={"STREAM_NDCG_REDIS_URL": url, "STREAM_NDCG_NAMESPACE": namespace,
                                      "STREAM_NDCG_CLOCK": "event", "STREAM_NDCG_IDEAL": ideal})
    writer = Writer(settings)
    started = time.perf_counter()
    writer.write_all(messages)
    print(len(messages) / (time.perf_counter() - started))


def run(python_path: str, url: str, namespace: str, messages_file: Path, ideal: str) -> float:
    env = dict(os.environ, PYTHONPATH=python_path)
    # -P: the working directory must not come before PYTHONPATH on sys.path.
    out = subprocess.run([sys.executable, "-P", "-m", "bench.versions_bench", "--child", url, namespace,
                          str(messages_file), ideal], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return float(out.stdout.split()[-1])


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5])
        return 0
    parser = argument_parser(__doc__)
    parser.add_argument("--against", default=FORMAT_4, help="the commit whose package is compared")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ideal", choices=("pool", "list"), default="pool")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stream-ndcg-versions-bench-") as root, \
            redis_server("versions") as server:
        old = package_of(args.against, Path(root, "old"))
        messages_file = Path(root, "messages.jsonl")
        messages_file.write_bytes(b"\n".join(value for _, value in workload(args.events, seed=29)))
        paths = {"this tree": str(ROOT), args.against[:12]: f"{old}{os.pathsep}{ROOT}"}
        rates: dict[str, list[float]] = {name: [] for name in paths}
        for round_number in range(args.rounds):
            # Alternated, and the first of each round alternated too.
            order = list(paths) if round_number % 2 == 0 else list(reversed(paths))
            for name in order:
                rates[name].append(run(paths[name], server.url, f"v{round_number}-{len(rates[name])}-{name[:4]}",
                                       messages_file, args.ideal))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    ratio = medians["this tree"] / medians[args.against[:12]]
    rows = "\n".join(f"| {name} | {medians[name]:.0f} | {', '.join(f'{v:.0f}' for v in rates[name])} |"
                     for name in rates)
    section = f"""## Versions

`{command(__file__)}`, {stamp()}, redis-server on loopback: {args.events:,} events of the service
bench's workload through the batch pipeline (no Kafka) of each version, ideal {args.ideal},
{args.rounds} runs each, alternated, each in a process of its own.

| package | median events/s | runs |
|---|---:|---|
{rows}

- throughput ratio this tree / {args.against[:12]}: **{ratio:.3f}**.
"""
    return publish(args.results, section, {"bench": "versions", "medians": medians, "ratio": ratio, "runs": rates,
                                           "against": args.against, "events": args.events, "ideal": args.ideal})


if __name__ == "__main__":
    sys.exit(main())
