"""What the benchmarks of bench/ share; each bench imports from here, never from another bench.

    results.py          bench/RESULTS.md: a section per bench, rewritten by it, and the
                        hand-written analysis under it that the rewrite keeps; each bench's
                        figures recorded in RESULTS.json beside it (for bench/targets.py); the
                        flags and the command line every bench reports
    servers.py          a Kafka broker and a redis-server on loopback for one bench run
    workloads.py        the simulated Zipf workload, its topic, and the bare kafka-python consumer
                        that reads it as a baseline
    service_process.py  `stream-ndcg run` in a process of its own: readiness, what it has taken in,
                        its memory and CPU, a catch-up timed
    pipeline.py         the service's batch pipeline in the bench's process, without Kafka: a writer,
                        and the cost of each step per event
    figures.py          percentiles of timings, Redis memory by key kind
    held_memory.py      the service's peak RSS and Redis's bytes with a number of impressions held
"""
