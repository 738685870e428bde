"""`ki eval`: retrieval quality on a labelled BEIR data set, measured through the real CDC path and
search service, in a database / connector / worker / index of its own.

* `metrics` — nDCG@k, recall@k, MRR@k (pure);
* `beir` — reading a BEIR folder, its name and language, choosing a subset, hashing the files;
* `report` — reference figures from the data set README, the printed table, the JSON record, the
  per-query diff and the bar chart;
* `tuning` — the semantic-weight / `rrf_k` grid searched on the train split only (pure);
* `isolation` — the eval's own database, connector, slot, topics, consumer group, index and worker;
  dropping them;
* `run` — loading PostgreSQL, waiting for the index, running the queries, the report.
"""
