"""What the tests share, in one home that every test imports (tests never import each other).

- `servers`: the session fixtures that start a real Kafka broker and redis-server (a pytest plugin);
- `wait`: waiting on an observable state with a deadline (`wait_until`), and a state that must hold (`holds`);
- `events`: sample events and the table of bad messages with their rejection reasons;
- `batches`: one batch through a store, as the service applies it (`apply_batch`);
- `store_contract`: the state-store contract, run for every store by a subclass per store;
- `service`: a `stream-ndcg run` process, its environment, scrapes and kill-on-teardown;
- `topics`: Kafka topics for one test;
- `replay`: simulated traffic, its batch replay and the comparison of the service's gauges with it;
- `security`: the Redis credentials and ACL of the service's commands;
- `deploy`: the deploy/ files read as data (dashboard queries, recording rules), and helm and promtool;
- `exporter`: an Exporter over the in-memory store, fed as the service feeds it.
"""
