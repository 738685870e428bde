"""`ki eval`: retrieval quality on BEIR SciFact, measured through the real CDC path and search service.

* `metrics` — nDCG@k, recall@k, MRR@k (pure);
* `scifact` — reading the data set and choosing a subset (pure apart from reading files);
* `report` — published baselines, the printed table, the JSON record and the bar chart;
* `tuning` — the leg-weight / `rrf_k` grid searched on the train split only (pure);
* `run` — loading PostgreSQL, the sync worker, waiting for the index, running the queries.
"""
