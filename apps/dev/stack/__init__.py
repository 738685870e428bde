"""The native local stack: PostgreSQL, Kafka (KRaft), Kafka Connect + Debezium and OpenSearch, run as
plain processes on loopback without Docker.

`artifacts` resolves the pinned Maven artifacts (`artifacts.xml`) into the stack cache, `service` holds
the one `Service` abstraction (start, health, stop) that `postgres`, `kafka`, `connect` and `opensearch`
specialise, `connector` registers the Debezium connector, and `manager` is what `ki stack …` calls.
`paths` says where state lives (the home, or under root `/var/lib/ki-sidecar/<home>-<hash>/` for the
services that run as the `postgres` account: `users`), `process` spawns and finds service processes.
"""
