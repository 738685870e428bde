"""The one settings object.

The classes below hold every setting with its default; a config file holds only the deliberate deviations
from them (the repository's `config.json` those of the shipped set-up; `ki config print` shows every setting,
its value and its default; `ki config check` validates a configuration). The file is the one `--config` or
`$KI_CONFIG` names (missing: an error), else the first of `CONFIG_SEARCH_PATH` that exists; none: the
defaults alone. Environment variables `KI_<SECTION>__<FIELD>` override
single fields (JSON for maps and lists). Anything unknown, mistyped or out of range stops start-up with
one line naming the key and the problem (`SettingsError`); a retired setting is ignored with a one-line
warning, so an older configuration keeps starting.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from ki.analysis import ANALYSIS_KINDS, check_analysis
from ki.errors import SettingsError
from ki.principals import check_principal

#: Where a config file is looked up when neither `--config` nor `$KI_CONFIG` names one, in this order: the
#: working folder's (a checkout's, run from its root; a folder of a deployment's own) before the machine's.
CONFIG_SEARCH_PATH: tuple[Path, ...] = (Path("config.json"), Path("/etc/ki-sidecar/config.json"))
ENV_PREFIX = "KI_"
REDACT_MIN_CHARS = 6

log = logging.getLogger(__name__)

#: A setting's place: section, group(s), field -- `("api", "jwt", "secret")` is `api.jwt.secret`, `KI_API__JWT__SECRET`.
SettingPath = tuple[str, ...]

#: Settings that no longer exist -> why; in a config file or a `KI_*` variable they are dropped with a warning.
RETIRED: dict[SettingPath, str] = {
    ("retrieval", "weight_decisions"): "decision records are searched apart from the legs and never fused",
}


_LIMITS_FIELDS = ("max_body_bytes", "max_query_chars", "max_limit", "max_filter_values", "max_token_bytes",
                 "max_traverse_depth", "max_traverse_fanout", "max_related", "max_scope_filter_bytes",
                 "max_concurrent_requests", "max_queued_requests", "queue_timeout_s")  # fmt: skip
_NAME_LOOKUP_FIELDS = ("max_candidates", "max_documents_per_name", "max_title_tokens", "min_title_tokens",
                       "max_identifier_tokens")  # fmt: skip
_STATS_FIELDS = ("enabled", "store_query_text", "retention_days", "max_rows", "buffer_rows", "batch_rows", "flush_s")


def _grouped(section: str, group: str, names: dict[str, str]) -> dict[SettingPath, SettingPath]:
    """Renames of settings that moved into a group of their section: old field name -> name in the group."""
    return {(section, old): (section, group, new) for old, new in names.items()}


#: Old name -> new name of a renamed setting (each name says one thing: "identity" is the caller, the
#: documents a query names are looked up by name; "evidence" is the answer's text budget, the reports
#: that decide the default mode are the mode gate's). The old name, in a config file or a `KI_*`
#: variable, still works, with a one-line warning.
RENAMED: dict[SettingPath, SettingPath] = {
    ("retrieval", "identity_enabled"): ("retrieval", "name_lookup_enabled"),
    **_grouped(
        "retrieval",
        "name_lookup",
        {f"{prefix}_{name}": name for prefix in ("identity", "name_lookup") for name in _NAME_LOOKUP_FIELDS},
    ),  # fmt: skip
    **_grouped(
        "retrieval",
        "rerank",
        {"rerank_url": "url", "rerank_timeout_s": "timeout_s", "rerank_api_key_env": "api_key_env"},
    ),  # fmt: skip
    **_grouped("retrieval", "graph_rag", {f"graph_rag_{name}": name for name in ("seeds", "max_added", "hop_penalty")}),
    **_grouped(
        "retrieval",
        "mode_gate",
        {
            "evidence_dir": "reports_dir",
            "mode_gate_reports_dir": "reports_dir",
            "evidence_significance_level": "significance_level",
            "mode_gate_significance_level": "significance_level",
            "self_eval_refresh_s": "self_eval_refresh_s",
            "self_eval_margin": "self_eval_margin",
        },
    ),  # fmt: skip
    ("api", "identity_cache_keys"): ("api", "caches", "name_keys"),
    ("api", "identity_cache_max_documents"): ("api", "caches", "name_max_documents"),
    ("api", "name_cache_keys"): ("api", "caches", "name_keys"),
    ("api", "name_cache_max_documents"): ("api", "caches", "name_max_documents"),
    ("retrieval", "expand_max_chunks_per_document"): ("retrieval", "neighbours_max_chunks_per_document"),
    ("retrieval", "decay_floor"): ("retrieval", "decay_min_weight"),
    **_grouped("api", "limits", {name: name for name in _LIMITS_FIELDS}),
    **_grouped("api", "limits", {"rate_limit_per_s": "rate_per_s", "rate_limit_burst": "rate_burst"}),
    **_grouped(
        "api",
        "caches",
        {
            "embedding_cache_size": "embedding_size",
            "embedding_cache_ttl_s": "embedding_ttl_s",
            "scope_cache_size": "scope_size",
            "scope_cache_max_ids": "scope_max_ids",
            "scope_cache_max_feed_lag_s": "scope_max_feed_lag_s",
        },
    ),  # fmt: skip
    **_grouped("api", "stats", {f"stats_{name}": name for name in _STATS_FIELDS}),
    **_grouped("api", "audit", {"audit_enabled": "enabled", "audit_retention_days": "retention_days"}),
    **_grouped("api", "ops", {"metrics_token": "metrics_token", "metrics_token_file": "metrics_token_file"}),
    **_grouped(
        "api",
        "ops",
        {"ops_window_s": "window_s", "ops_scrape_timeout_s": "scrape_timeout_s", "ops_lane_urls": "lane_urls"},
    ),  # fmt: skip
    **_grouped(
        "api",
        "jwt",
        {
            "hmac_enabled": "enabled",
            "jwt_secret": "secret",
            "jwt_secret_file": "secret_file",
            "jwt_algorithm": "algorithm",
            "jwt_issuer": "issuer",
            "jwt_audience": "audience",
            "subject_claim": "subject_claim",
            "groups_claim": "groups_claim",
            "roles_claim": "roles_claim",
            "claims_carry_kinds": "claims_carry_kinds",
        },
    ),  # fmt: skip
}


#: A secret setting: never in a repr (so never in a log line that prints settings), redacted by
#: `Settings.redact`, and readable from a file (`<name>_file`) so it stays out of config.json.
Secret = Annotated[str, Field(repr=False, json_schema_extra={"secret": True})]


def _secret_names(model: type[BaseModel]) -> list[str]:
    return [
        name
        for name, info in model.model_fields.items()
        if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("secret")
    ]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _secrets_from_files(cls, data: Any) -> Any:
        """`<secret>_file`: the secret is the file's content (one trailing newline dropped), read here."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name in _secret_names(cls):
            path = data.get(f"{name}_file")
            if not path:
                continue
            try:
                text = Path(str(path)).expanduser().read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
                raise ValueError(f"{name}_file: cannot read {path}: {reason}") from None
            data[name] = text.removesuffix("\n").removesuffix("\r")
        return data


class _Group(_Section):
    """A group of related settings inside a section (`api.jwt`, `retrieval.name_lookup`): its own object in
    config.json, `KI_<SECTION>__<GROUP>__<FIELD>` in the environment; an override names single fields of it."""


class TextAnalysis(_Section):
    """OpenSearch's index `analysis` shape: named definitions of char filters, tokenizers, filters, analyzers."""

    char_filter: dict[str, dict[str, Any]] = Field(default_factory=dict)
    tokenizer: dict[str, dict[str, Any]] = Field(default_factory=dict)
    filter: dict[str, dict[str, Any]] = Field(default_factory=dict)
    analyzer: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def as_map(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {kind: getattr(self, kind) for kind in ANALYSIS_KINDS}


class RerankSettings(_Group):
    """The rerank gateway (search.ranking.rerank): an OpenAI-compatible chat-completions endpoint."""

    url: str = ""
    timeout_s: float = Field(20.0, gt=0)
    # Environment variable holding the gateway's bearer key (unset/empty: no Authorization header).
    api_key_env: str = "KI_RERANK_API_KEY"


class GraphRagSettings(_Group):
    """Graph augmentation (search.ranking.augment): the top `seeds` documents' forward `references` relations
    pull at most `max_added` cited documents into the pool, scored seed score x `hop_penalty`."""

    seeds: int = Field(5, ge=1, le=100)
    max_added: int = Field(10, ge=1, le=200)
    hop_penalty: float = Field(0.5, gt=0.0, le=1.0)


class AnswerCoverageSettings(_Group):
    """The answer gate's second signal (search.ranking.coverage): an answer is empty (`no_credible_evidence`) when
    the semantic leg's best cosine similarity is below `similarity[signature]` and the best of the first `hits`
    fused hits holds less than `min_coverage` of the question's content words. A signature without an entry: no
    gate. Never when an identifier matched."""

    similarity: dict[str, float] = Field(default_factory=dict)
    min_coverage: float = Field(0.5, ge=0.0, le=1.0)
    hits: int = Field(3, ge=1, le=50)

    @model_validator(mode="after")
    def _check(self) -> AnswerCoverageSettings:
        for signature, bar in self.similarity.items():
            if not -1.0 <= bar <= 1.0:
                raise ValueError(f"similarity[{signature!r}] is a cosine similarity in [-1, 1], got {bar}")
        return self


class NameLookupSettings(_Group):
    """Name look-up, the identity preflight (search.names.keys): identifiers and exact titles named in the
    query are resolved against the caller's scope before ranking; one named document is the top hit,
    several are reported as `ambiguous`. A name carried by more than `max_candidates` visible documents (or
    by more than `max_documents_per_name` documents at all) is common and names nothing."""

    max_candidates: int = Field(5, ge=1, le=50)
    max_documents_per_name: int = Field(1000, ge=1, le=100_000)
    # Longest names looked up, in tokens of the name key; a title shorter than min_title_tokens names its
    # document only as the whole query (a one-word title inside a query is a topic, not a name).
    max_title_tokens: int = Field(24, ge=1, le=200)
    min_title_tokens: int = Field(2, ge=1, le=200)
    max_identifier_tokens: int = Field(8, ge=1, le=64)


class ModeGateSettings(_Group):
    """Which mode a request without one gets (search.ranking.mode_gate): the semantic leg is on by default
    only where a `ki eval` report matching these settings shows hybrid >= lexical."""

    # The folder of reports read at start-up (a relative path starts at the working folder); None: the reports
    # shipped in the package (search/ranking/gate_reports/, copies of the committed benchmarks/ reports).
    reports_dir: str | None = Field(None, min_length=1)
    # A report where hybrid is below lexical turns the semantic leg off only if the per-query paired test of
    # the report (`hybrid_vs_lexical`) finds the difference significant at this level; reports without that
    # test count every difference.
    significance_level: float = Field(0.05, gt=0, le=1)
    # How often each API process re-reads the newest `ki eval --self` report from PostgreSQL (seconds): a new
    # report reaches every process on every machine within this time, without a restart.
    self_eval_refresh_s: float = Field(30.0, gt=0, le=3600)
    # `ki eval --self` turns hybrid off only when hybrid loses by more than this (nDCG@10), significantly:
    # its pseudo-queries are the documents' own words, where lexical is near its ceiling and a small loss of
    # hybrid says nothing about users' questions (apps.dev.eval.self_check).
    self_eval_margin: float = Field(0.02, ge=0, le=1)
    # A request that names `mode` hybrid or semantic where the evidence says keyword-only (no report matches these
    # settings, or hybrid measured worse): "refuse" answers 409 `mode_unavailable` with the gate's reason, never a
    # silent substitution; "honour" runs it anyway (an operator's choice; `ki eval` and the benches, which
    # measure every mode, do). A default pinned by the operator (`retrieval.default_mode`) is not evidence either
    # way: explicit modes are honoured under a pin.
    explicit_without_evidence: Literal["refuse", "honour"] = "refuse"
    # Signed evidence (ki.evidence_keys): a report counts only when the package pins it (the shipped ones) or a
    # key listed here (PEM public key files, `ki keys` makes a pair) signed it; `ki eval` and `ki eval --self`
    # sign with `signing_key_file` (the private key: keep it out of the repository).
    trusted_key_files: list[str] = []
    signing_key_file: str | None = None
    # What a report measured must also be within these, or it does not count (None: no bound): the p99 of its
    # hybrid queries (ms), the peak RSS of the process that ran the search and the embedder (MB), the index size.
    max_p99_ms: float | None = Field(None, gt=0)
    max_rss_mb: float | None = Field(None, gt=0)
    max_index_bytes: int | None = Field(None, gt=0)


class RetrievalSettings(_Section):
    """The spec's `retrieval.*` keys, with the spec's defaults, flat where the spec puts them; each feature
    we added has its switch (`<feature>_enabled`) flat beside them and its tuning in a group of its name."""

    index_name: str = Field("knowledge-index-chunks-v1", min_length=1)
    embedding_dimensions: int = Field(1536, ge=2, le=16000)
    vector_engine: Literal["lucene", "faiss", "nmslib"] = "lucene"
    vector_space_type: Literal["cosinesimil", "l2", "innerproduct"] = "cosinesimil"
    hnsw_m: int = Field(16, ge=2, le=100)
    hnsw_ef_construction: int = Field(128, ge=2, le=4096)
    # Candidates the kNN leg's HNSW search keeps per segment (`method_parameters.ef_search`, never below the
    # leg's k); 0: the engine's default. E5 passages lie close together (query-to-passage cosines of a 100k
    # corpus differ by ~0.01 from the 1st to the 10th), so a small ef misses true neighbours (BENCHMARKS.md).
    hnsw_ef_search: int = Field(400, ge=0, le=10_000)
    chunk_chars: int = Field(1200, ge=50, le=100_000)
    chunk_overlap_chars: int = Field(120, ge=0)
    chunk_contextualize: bool = True
    profile_embeddings: bool = True
    clause_embeddings: bool = True
    fusion_rrf_k: int = Field(60, ge=1, le=10_000)
    # How the legs' lists become one ranking (search.ranking.fusion.fuse): weighted RRF over ranks, or the weighted
    # sum of each leg's scores normalised per query (minmax; dbsf: mean +- 3 sd), over the caller's own rows.
    fusion_method: Literal["rrf", "minmax", "dbsf"] = "rrf"
    weight_lexical: float = Field(1.0, ge=0)
    weight_semantic: float = Field(1.0, ge=0)
    weight_identifier: float = Field(1.5, ge=0)
    version_status_boost: dict[str, float] = Field(
        default_factory=lambda: {"executed": 1.2, "final": 1.0, "unknown": 0.8, "draft": 0.7}
    )
    # Added to the fused score of a promoted document's rows (`documents.promoted`), after fusion, status boost and
    # decay. Enters the ranking hash only when it differs from this default (search.ranking.mode_gate).
    promoted_bonus: float = Field(0.01, ge=0, le=1.0)
    collapse_per_document: bool = True
    max_chunks_per_document: int = Field(3, ge=1, le=100)
    rerank_enabled: bool = False
    rerank_model: str = "rerank"
    rerank: RerankSettings = RerankSettings()
    # Off by default (measured on gesetze-headings-dev: BENCHMARKS.md).
    graph_rag_enabled: bool = False
    graph_rag: GraphRagSettings = GraphRagSettings()
    # Authoritative class (search.ranking.augment): the ontology key of a document type (its whole subtree, e.g.
    # statutes) whose best lexical match for the query is always on the first page -- at its end when the
    # ranking did not put it there; nothing ranked is dropped. None: off.
    authoritative_doc_type: str | None = Field(None, min_length=1)
    # Temporal decay: fused score x (w + (1 - w) / (1 + age in years)), w = decay_min_weight, from doc_date (as of
    # request's `as_of`, else today); off by default -- the dev sets carry no dates to measure it on.
    decay_enabled: bool = False
    decay_min_weight: float = Field(0.8, ge=0.0, le=1.0)
    # Synonyms (search.ranking.synonyms): groups of phrases meaning the same; a query containing one gets the others
    # added for the lexical and semantic legs. None: the shipped German list (docs/search-api.md).
    synonyms_enabled: bool = False
    synonyms: list[list[str]] | None = None
    # The query's own words (search.query_words): dates, ranges, comparison intent, provisions and file numbers
    # read from the query into the plan (a version asked for by its day becomes `as_of`, a comparison of versions
    # labels each hit with the earlier one; the text legs search the rest); `explain` shows them.
    query_words_enabled: bool = True
    # `expand: true` requests: chunks per document in all (its hits on the page + neighbours)
    neighbours_max_chunks_per_document: int = Field(3, ge=1, le=100)
    # Relevance floor of the semantic leg (search.ranking.floor): a kNN hit whose cosine similarity to the query is
    # below the floor stored for the index's embedding signature is no evidence and leaves before fusion.
    # Cosine ranges differ by model, so the floor is per signature (tuned on train splits by
    # `ki eval --tune`); a signature without an entry has no floor.
    semantic_floor_enabled: bool = False
    semantic_floor: dict[str, float] = Field(default_factory=dict)
    # The floor decides the whole answer too: where the semantic leg found hits but none reaches the floor and
    # no identifier matched, the answer is empty (`no_credible_evidence`) although the lexical leg found words.
    # Off by default: at the shipped floor it adds little on the dev sets' train splits, at the floors where it helps
    # it costs xquad-de more than 0.01 nDCG@10 (BENCHMARKS.md, issue 50 item 3).
    semantic_floor_gates_answer: bool = False
    # The answer's lexical coverage of the question (search.ranking.coverage): an on-topic passage that lacks the
    # question's own words is no answer either. Off by default (BENCHMARKS.md, issue 50 item 3).
    answer_coverage_gate_enabled: bool = False
    answer_coverage_gate: AnswerCoverageSettings = AnswerCoverageSettings()
    # Evidence budget: total characters of hit text (and `context`) in one answer; None: no budget.
    # A request's `evidence_budget_chars` overrides it.
    evidence_budget_chars: int | None = Field(None, ge=1, le=10_000_000)
    name_lookup_enabled: bool = True
    name_lookup: NameLookupSettings = NameLookupSettings()
    # The analyzer of the `text` field: a built-in name or one defined in `text_analysis.analyzer`.
    text_analyzer: str = Field("german", min_length=1)
    # The default mode when a request names none: "auto" lets the evidence decide (the deployment's own
    # `ki eval --self` report first, else the reports in mode_gate.reports_dir); an operator can pin one instead.
    default_mode: Literal["auto", "hybrid", "lexical", "semantic"] = "auto"
    mode_gate: ModeGateSettings = ModeGateSettings()
    text_analysis: TextAnalysis = TextAnalysis()

    @model_validator(mode="after")
    def _check(self) -> RetrievalSettings:
        if self.chunk_overlap_chars >= self.chunk_chars:
            raise ValueError(
                f"chunk_overlap_chars ({self.chunk_overlap_chars}) must be smaller than "
                f"chunk_chars ({self.chunk_chars})"
            )
        for status, boost in self.version_status_boost.items():
            if boost < 0:
                raise ValueError(f"version_status_boost[{status!r}] must be >= 0, got {boost}")
        for signature, floor in self.semantic_floor.items():
            if not -1.0 <= floor <= 1.0:
                raise ValueError(f"semantic_floor[{signature!r}] is a cosine similarity in [-1, 1], got {floor}")
        for group in self.synonyms or []:
            if len(group) < 2 or any(not phrase.strip() for phrase in group):
                raise ValueError(f"synonyms: each group needs two or more non-blank phrases, got {group!r}")
        if self.rerank_enabled and not self.rerank.url:
            raise ValueError("rerank.url: rerank_enabled is true but it is empty (the gateway's base URL, e.g. .../v1)")
        check_analysis(self.text_analyzer, self.text_analysis.as_map())
        return self


class DatabaseSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(55432, ge=1, le=65535)
    name: str = "ki"
    user: str = "ki"
    password: Secret = "ki"
    password_file: str = ""
    pool_size: int = Field(10, ge=1, le=200)
    # TLS to PostgreSQL (libpq's own parameters): verify-full checks the certificate and the host name.
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = "prefer"
    sslrootcert: str = ""
    sslcert: str = ""
    sslkey: str = ""

    def tls_parameters(self) -> dict[str, str]:
        """libpq connection parameters for TLS (only those set)."""
        values = {"sslmode": self.sslmode, "sslrootcert": self.sslrootcert, "sslcert": self.sslcert,
                  "sslkey": self.sslkey}  # fmt: skip
        return {key: str(Path(v).expanduser()) if key != "sslmode" else v for key, v in values.items() if v}

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.user}:{self.password}@{self.host}:{self.port}/{self.name}"

    @property
    def dsn(self) -> str:
        """libpq connection string (for psycopg without SQLAlchemy)."""
        tls = "".join(f" {key}={value}" for key, value in self.tls_parameters().items())
        return f"host={self.host} port={self.port} dbname={self.name} user={self.user} password={self.password}{tls}"


class KafkaSettings(_Section):
    bootstrap_servers: str = "127.0.0.1:59092"
    controller_port: int = Field(59093, ge=1, le=65535)
    topic_prefix: str = Field("ki", pattern=r"^[A-Za-z0-9_.-]+$")
    partitions: int = Field(3, ge=1, le=1000)
    # Replicas of every topic the sidecar or Debezium creates, and how many must have a write before it is
    # acknowledged (producers use acks=all): 3 and 2 on a cluster of three brokers.
    replication_factor: int = Field(1, ge=1, le=10)
    min_insync_replicas: int = Field(1, ge=1, le=10)
    # TLS and SASL to the brokers: the sync worker's clients (Faust) and the admin and consumer clients.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    sasl_username: str = ""
    sasl_password: Secret = ""
    sasl_password_file: str = ""
    ssl_ca_file: str = ""
    ssl_cert_file: str = ""
    ssl_key_file: str = ""

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @model_validator(mode="after")
    def _sasl_needs_credentials(self) -> KafkaSettings:
        if self.uses_sasl and not (self.sasl_username and self.sasl_password):
            raise ValueError(f"sasl_username: {self.security_protocol} needs sasl_username and sasl_password")
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas: {self.min_insync_replicas} is more than replication_factor "
                f"{self.replication_factor} (no write could ever be acknowledged)"
            )
        return self

    @property
    def brokers(self) -> list[str]:
        """`bootstrap_servers` as a list of host:port."""
        return [server.strip() for server in self.bootstrap_servers.split(",") if server.strip()]


class ConnectSettings(_Section):
    url: str = "http://127.0.0.1:58083"
    connector_name: str = "ki-postgres"
    publication_name: str = Field("ki_publication", pattern=r"^[a-z_][a-z0-9_]*$")
    slot_name: str = Field("ki_slot", pattern=r"^[a-z_][a-z0-9_]*$")
    snapshot_mode: Literal["initial", "no_data", "always", "when_needed", "never"] = "initial"
    # Also the scope cache's proof that Debezium is current (search.access.invalidation): short on purpose.
    heartbeat_interval_ms: int = Field(1_000, ge=100)
    # Host name Connect uses to reach PostgreSQL; empty = database.host (differs under docker compose).
    database_hostname: str = ""
    # Debezium's own PostgreSQL role (least privilege: deploy/postgres/roles.sql); empty = database.user.
    database_user: str = ""
    database_password: Secret = ""
    database_password_file: str = ""
    # Connect's REST API: basic authentication and the CA that signed its certificate (https URLs).
    username: str = ""
    password: Secret = ""
    password_file: str = ""
    ca_file: str = ""


class OpenSearchSettings(_Section):
    # One node's URL, or a cluster's, comma-separated: the clients spread requests over them and skip a
    # node that fails until it answers again.
    url: str = "http://127.0.0.1:59200"
    transport_port: int = Field(59300, ge=1, le=65535)
    timeout_s: float = Field(30.0, gt=0)
    max_retries: int = Field(5, ge=0, le=50)
    number_of_shards: int = Field(1, ge=1, le=1024)
    number_of_replicas: int = Field(0, ge=0, le=10)
    refresh_interval: str = "1s"
    max_terms_count: int = Field(65_536, ge=1)
    # gzip request and response bodies: worth it over a slow network, pure CPU on loopback or a LAN
    # (off: search ~1.5 ms faster per request here; bulk bodies with vectors compress well on a WAN).
    http_compress: bool = False
    # Credentials (the security plugin's internal users) and TLS (https URLs): the CA bundle that signed
    # the server's certificate, a client certificate for certificate authentication, hostname checks.
    username: str = ""
    password: Secret = ""
    password_file: str = ""
    ca_file: str = ""
    client_cert_file: str = ""
    client_key_file: str = ""
    verify_certs: bool = True

    @property
    def urls(self) -> list[str]:
        """`url` as a list (one per node)."""
        return [url.strip().rstrip("/") for url in self.url.split(",") if url.strip()]

    @model_validator(mode="after")
    def _one_scheme(self) -> OpenSearchSettings:
        schemes = {url.split("://", 1)[0] for url in self.urls}
        if not self.urls or not schemes <= {"http", "https"} or len(schemes) > 1:
            raise ValueError(f"url: {self.url!r} must be one or more http(s):// URLs, all of one scheme")
        return self


class EmbeddingSettings(_Section):
    provider: Literal["local", "openai"] = "local"
    # local provider: "multilingual-e5-small" (German capable) or "all-MiniLM-L6-v2" (English);
    # openai provider: the remote model's name
    model: str = "multilingual-e5-small"
    batch_size: int = Field(32, ge=1, le=2048)
    # the embedding window in tokens (prefix and special tokens included); longer texts are cut
    max_tokens: int = Field(512, ge=8, le=8192)
    url: str = ""
    api_key_env: str = "KI_EMBEDDING_API_KEY"
    timeout_s: float = Field(30.0, gt=0)
    retries: int = Field(3, ge=0, le=20)
    # openai provider: requests in flight at once for one `embed` call (each of up to batch_size texts)
    concurrency: int = Field(1, ge=1, le=64)
    # local provider: model runs at once, one thread each (0 = one per CPU core)
    threads: int = Field(0, ge=0, le=256)
    # local provider: where models converted on first use are cached (multilingual-e5-small)
    model_cache_dir: str = "~/.cache/ki-sidecar/models"
    # openai provider: send `dimensions` (= retrieval.embedding_dimensions) with each request
    send_dimensions: bool = False
    # openai provider: prepended to queries / documents (e.g. "query: " / "passage: " for e5 models);
    # the local models bring their own
    query_prefix: str = ""
    passage_prefix: str = ""


class StreamsSettings(_Section):
    # The content lane's consumer group; the access and principals lanes' are `<app_id>-access` and
    # `<app_id>-principals` (projections.lanes).
    app_id: str = Field("ki-sidecar", pattern=r"^[A-Za-z0-9_.-]+$")
    # /metrics of the content, access and principals lanes (each lane is its own process); the access lane's
    # port defaults to web_port + 1 and the principals lane's to web_port + 2, so overriding web_port alone
    # moves them all.
    web_port: int = Field(56066, ge=1, le=65535)
    access_web_port: int | None = Field(None, ge=1, le=65535)
    principals_web_port: int | None = Field(None, ge=1, le=65535)
    # The address the lanes' /metrics and /healthz listen on: loopback unless a scraper in another container
    # or pod must reach them (they say nothing about documents: counts, lag, timings).
    web_bind: str = Field("127.0.0.1", min_length=1)
    # Where the lanes keep what Faust writes to disk (it makes a directory even with in-memory tables):
    # `<data_dir>/faust/<consumer group>`. Empty: `stack.home`, where they kept it before this setting existed
    # (the image and the systemd units still set KI_STACK__HOME for it); see `Settings.lanes_data_dir`.
    data_dir: str = ""
    dlq_topic: str = "ki.dlq"
    # Access lane: grants, memberships, aliases, observations, soft deletes, text-first rows -- nothing it
    # does embeds, so it takes big batches and commits after each. Big enough that a bulk import's events
    # and a document committed just after it share a batch, where the short one is written first.
    batch_max_events: int = Field(2500, ge=1, le=100_000)
    # One `_bulk` request: at most this many rows and bytes (the access lane also cuts its text rows into
    # slices of this many, each written as soon as it is cut).
    bulk_max_rows: int = Field(500, ge=1, le=100_000)
    batch_max_bytes: int = Field(5_000_000, ge=1024)
    batch_linger_ms: int = Field(100, ge=0, le=60_000)
    # Content lane: small event batches (offsets advance after each), embedded in micro-batches of at most
    # this many rows, each written as soon as its vectors exist (rows become searchable step by step; 16
    # rows of e5-small take ~3-4 s on two cores, so progress moves at least every 5 s).
    content_batch_max_events: int = Field(50, ge=1, le=100_000)
    embed_micro_batch_rows: int = Field(16, ge=1, le=100_000)
    # The content lane's CPU niceness (0-19): embedding yields the CPU to the access lane, PostgreSQL,
    # Kafka and OpenSearch, and still takes all of it when they are idle.
    content_nice: int = Field(10, ge=0, le=19)
    # Model runs at once in the content lane (its `embedding.threads`; 0: embedding.threads as set). One
    # leaves a core to the access lane, the API and the services: under a 2,000-chunk backlog on two cores
    # it drained as fast as two (10.4 vs 10.7 chunks/s) while access p99 stayed 2.0 s instead of 5.1 s.
    content_embed_threads: int = Field(1, ge=0, le=256)
    max_attempts: int = Field(5, ge=1, le=100)
    # How long the broker waits for a silent (crashed) worker before handing its partitions to the others
    # or to its restarted self; the Faust default (60 s) stalled the sync for a minute after every crash.
    session_timeout_s: float = Field(10.0, ge=3.0, le=300.0)
    # A lane with lag that has neither received nor resolved a batch for this long is stalled (streams.liveness):
    # its /healthz answers 503 and `ki sync run` restarts it, as it does a lane that stopped answering.
    stall_after_s: float = Field(300.0, ge=2.0, le=86_400.0)
    # How often `ki sync run` asks each lane's /healthz.
    liveness_interval_s: float = Field(10.0, ge=0.2, le=3600.0)
    # How often the access lane re-projects the documents whose `expires_at` passed since its last sweep (an expiry
    # no change announces): their rows leave the index. Searches exclude them in SQL from the moment they expire.
    expiry_sweep_s: float = Field(60.0, ge=0.5, le=86_400.0)
    # Further indices (names or patterns) whose stored vectors the content lane takes for an identical
    # embedded string, besides its own index: only those built with the same embedding signature, resolved
    # when the lane starts; only vectors are read from them, never rows (`ki eval` worlds share theirs).
    vector_sources: list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9*][a-z0-9_.*+-]*$")]] = []

    def lane_web_port(self, lane: str) -> int:
        """The port of a lane's /metrics ("content", "access" or "principals")."""
        if lane == "content":
            return self.web_port
        if lane == "principals":
            return self.principals_web_port or self.web_port + 2
        return self.access_web_port or self.web_port + 1


#: A principal in the settings: well-formed (`kind:name`, `ki.principals`), kept as written.
Principal = Annotated[str, AfterValidator(check_principal)]


class SecuritySettings(_Section):
    source_acl_mode: Literal["sufficient", "intersect"] = "sufficient"
    admin_principals: list[Principal] = Field(default_factory=lambda: ["role:admin", "system:admin"])
    # Who may read how the service runs (a search's `timings_ms`, `GET /metrics`) without seeing more
    # documents: a token naming one of these, or an administrator's. Matched on the token's own
    # principals (no aliases or groups), so no SQL runs for it.
    operator_principals: list[Principal] = Field(default_factory=lambda: ["role:operator"])
    aliases: dict[Principal, Principal] = Field(default_factory=dict)


class JwtSettings(_Group):
    """The API's own HMAC-signed tokens (`ki token`, the demo, tests); identity providers' tokens are `oidc.*`."""

    # Accept them at all; switch off where every caller comes from an identity provider (oidc.*).
    enabled: bool = True
    secret: Secret = Field("change-me-local-only-secret-0123456789", min_length=16)
    secret_file: str = ""
    algorithm: Literal["HS256", "HS384", "HS512"] = "HS256"
    issuer: str = "ki-sidecar"
    audience: str = "ki-search"
    subject_claim: str = "sub"
    groups_claim: str = "groups"
    roles_claim: str = "roles"
    # The subject becomes `user:<sub>`, each group `group:<g>`, whatever they contain; on, a subject or
    # group that already reads `kind:name` is taken as that principal: only for a signer that writes
    # principals on purpose (else a subject "role:admin" is an administrator).
    claims_carry_kinds: bool = False


class LimitsSettings(_Group):
    """What one request may ask for, and how much load the API takes before it refuses."""

    max_body_bytes: int = Field(65_536, ge=1024)
    max_query_chars: int = Field(2_000, ge=1)
    max_limit: int = Field(100, ge=1, le=500)
    max_filter_values: int = Field(100, ge=1)
    # A bearer token longer than this is rejected (401) before any decoding (aiohttp itself refuses header
    # fields over 8190 bytes, hence the ceiling).
    max_token_bytes: int = Field(4096, ge=256, le=8000)
    # Relations (search.documents.read, search.documents.graph): how deep `POST /v1/traverse` may go, how many
    # edges it follows out of one document at most, and how many related documents one answer lists at most.
    max_traverse_depth: int = Field(3, ge=1, le=10)
    max_traverse_fanout: int = Field(50, ge=1, le=1000)
    max_related: int = Field(200, ge=1, le=10_000)
    # Documents, related, traverse and decision search answer at the next multiple of this many milliseconds
    # from the request's start (0: at once). Their statements and rows are the same whether or not hidden rows
    # exist, but PostgreSQL's own work below them is not (an index probe that finds a row and refuses it
    # against one that finds none): released on a fixed grid, the answers of both cases leave together.
    release_quantum_ms: float = Field(25.0, ge=0, le=1000)
    # Ranked and metadata searches answer at the next multiple of this many milliseconds from the facade's
    # start (0: at once). The same statements, requests and rows run whether or not hidden rows exist, but
    # below them the engines' own work does not quite (PostgreSQL judging a hidden title's carrier, OpenSearch
    # reading a hidden word's postings, a change being synced on the same cores): a grid coarser than those
    # fractions of a millisecond lets both cases leave together. Costs half a quantum per search on average.
    search_release_quantum_ms: float = Field(5.0, ge=0, le=1000)
    # Reading (search.documents.text): at most this many characters of a version's text per request.
    max_read_chars: int = Field(20_000, ge=100, le=1_000_000)
    # The scope clause each leg carries (search.access.scope): a larger scope is sent as its projects, or not
    # at all, and checked hit by hit. Three legs: a request's scope filters stay under 64 KiB.
    max_scope_filter_bytes: int = Field(16_384, ge=256, le=21_000)
    # Overload: at most max_concurrent_requests run, at most max_queued_requests wait for a slot (more:
    # 429), none longer than queue_timeout_s (503).
    max_concurrent_requests: int = Field(64, ge=1)
    max_queued_requests: int = Field(64, ge=0)
    queue_timeout_s: float = Field(10.0, gt=0)
    # Per caller (principal set, per process): a token bucket of `rate_burst` requests refilled at
    # `rate_per_s` (0: no limit); an empty bucket is 429 with Retry-After (search.rate_limit).
    rate_per_s: float = Field(20.0, ge=0)
    rate_burst: int = Field(100, ge=1)


class CachesSettings(_Group):
    """The API's in-process caches; each one's size 0 switches it off."""

    # Query vectors (search.ranking.query_vectors): entries and their time to live.
    embedding_size: int = Field(1024, ge=0)
    embedding_ttl_s: int = Field(600, ge=0)
    # Scope cache (search.access.scope_cache): entries (callers + scopes), ids held across all scopes
    # (8 bytes each, plus the principals of their keys), resolved principals held across all callers
    # (~300 bytes each: a caller of 25,000 groups is ~7 MiB), used only while its CDC invalidation feed is
    # at most this far behind PostgreSQL.
    scope_size: int = Field(4096, ge=0)
    scope_max_ids: int = Field(5_000_000, ge=0)
    scope_max_principals: int = Field(500_000, ge=1)
    scope_max_feed_lag_s: float = Field(5.0, gt=0)
    # A scope or name entry a change invalidated is still answered for this long while it is computed again
    # in the background (0: never; the request computes it): the request then costs what a hit costs, so no
    # caller learns by a search's time that somebody changed something (search.access.scope_cache).
    scope_stale_s: float = Field(5.0, ge=0)
    # Name look-up cache (search.names.cache): name keys and documents held across them, fed by the scope
    # cache's invalidation feed and used only while it is current (needs the scope cache).
    name_keys: int = Field(100_000, ge=0)
    name_max_documents: int = Field(200_000, ge=0)
    # Each name entry belongs to one caller and lives at most this long (it holds words of a query).
    name_ttl_s: float = Field(600.0, gt=0)


class StatsSettings(_Group):
    """Retrieval statistics (search.telemetry.stats): one row per ranked query in ki_search_stats, written in
    batches (buffer bounded; a full buffer drops the oldest), kept retention_days and at most max_rows; the
    query text only when store_query_text (queries can name clients and matters). The access audit is
    written in batches of the same sizes."""

    enabled: bool = True
    store_query_text: bool = False
    retention_days: int = Field(30, ge=1, le=3650)
    max_rows: int = Field(1_000_000, ge=1)
    buffer_rows: int = Field(10_000, ge=1)
    batch_rows: int = Field(200, ge=1)
    flush_s: float = Field(1.0, gt=0, le=3600)


class EvidenceSettings(_Group):
    """Text handed out (search hits, their neighbouring chunks, reading a version): passages that read as
    instructions to a model (search.evidence.injection) are flagged with their spans ("flag"), or replaced
    ("redact")."""

    injection: Literal["flag", "redact"] = "flag"
    # Where a lawyer opens a cited source object, per source kind: a URL template with `{external_ref}` (the
    # object's ref, percent-encoded, `/` kept), e.g. {"sharepoint": "https://dms.example/open?id={external_ref}"}.
    # A kind without one links to its raw ref (search.documents.sources).
    source_urls: dict[str, str] = Field(default_factory=dict)

    @field_validator("source_urls")
    @classmethod
    def _templates(cls, value: dict[str, str]) -> dict[str, str]:
        for kind, template in value.items():
            if "{external_ref}" not in template:
                raise ValueError(f"the template for {kind!r} has no {{external_ref}}: {template!r}")
        return value


class ConsistencySettings(_Group):
    """Writers that wait for their own writes (search.consistency): a search or filter request carrying a
    `consistency_token` (the LSN its writer read after committing) waits until the access lane has applied
    every change committed up to it, at most `max_wait_s`, polling Kafka every `poll_ms`; past that it is
    answered `stale`."""

    max_wait_s: float = Field(10.0, gt=0, le=120)
    poll_ms: int = Field(20, ge=5, le=1000)


class AuditSettings(_Group):
    """The access audit (search.telemetry.audit): one row per /v1 request and MCP tool call in ki_access_audit
    (who, which endpoint, status, the documents the answer named), kept retention_days, read by administrators
    (`GET /v1/audit`)."""

    enabled: bool = True
    retention_days: int = Field(365, ge=1, le=3650)


class OpsSettings(_Group):
    """What operators read: `GET /metrics` and the operations dashboard (search.telemetry.ops)."""

    # `GET /metrics` answers a bearer token of an operator (security.operator_principals) or this static
    # token (empty: none), e.g. Prometheus' `credentials_file`; anyone else gets 401/403.
    metrics_token: Secret = ""
    metrics_token_file: str = ""
    # The dashboard's window: commit -> visible quantiles and request rates over the last this many seconds.
    window_s: float = Field(300.0, ge=10, le=86_400)
    # How long the dashboard waits for a lane's /metrics before showing it as down.
    scrape_timeout_s: float = Field(2.0, gt=0, le=60)
    # Each sync lane's /metrics for the dashboard ({"content": url, "access": url}); empty: the lanes on this
    # machine at streams.web_port and streams.access_web_port.
    lane_urls: dict[str, str] = Field(default_factory=dict)


class ApiSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    # The console (`/console`, search.web.console): in demo mode only, a picker of the demo users that mints
    # local tokens -- anyone who reaches the API can then act as anyone, so never on a shared machine.
    demo_mode: bool = False
    jwt: JwtSettings = JwtSettings()
    limits: LimitsSettings = LimitsSettings()
    caches: CachesSettings = CachesSettings()
    stats: StatsSettings = StatsSettings()
    audit: AuditSettings = AuditSettings()
    evidence: EvidenceSettings = EvidenceSettings()
    consistency: ConsistencySettings = ConsistencySettings()
    ops: OpsSettings = OpsSettings()


OidcAlgorithm = Literal["RS256", "ES256"]
OIDC_ALGORITHMS: tuple[OidcAlgorithm, ...] = ("RS256", "ES256")


class OidcSettings(_Section):
    """Callers signed in at an OpenID Connect provider (search.web.oidc): RS256/ES256 access tokens verified
    against the provider's published keys. Off while `issuer` is empty; HMAC tokens (`api.jwt_*`) are
    accepted beside them while `api.hmac_enabled`."""

    # The provider's issuer exactly as its tokens carry it (Keycloak: https://host/realms/<realm>).
    issuer: str = ""
    # The API's audience: a token must name it in `aud` (Keycloak: an audience mapper; Entra ID: the app id).
    audience: str = ""
    # Where the keys are; empty: `jwks_uri` of {issuer}/.well-known/openid-configuration.
    jwks_url: str = ""
    algorithms: list[OidcAlgorithm] = Field(default_factory=lambda: list(OIDC_ALGORITHMS), min_length=1)
    # Tolerated clock difference for exp, nbf and iat.
    clock_skew_s: float = Field(60.0, ge=0, le=600)
    # Keys are fetched again when older than this, and at once (but at most every refresh_min_interval_s)
    # for a token whose `kid` is not among them: a key rotated in at the provider is picked up.
    jwks_cache_ttl_s: float = Field(3600.0, ge=10, le=86_400)
    jwks_refresh_min_interval_s: float = Field(30.0, ge=0, le=3600)
    http_timeout_s: float = Field(5.0, gt=0, le=60)
    # Claim paths (dots walk into objects: Keycloak's realm roles are `realm_access.roles`).
    subject_claim: str = "sub"
    groups_claim: str = "groups"
    roles_claim: str = "realm_access.roles"
    # Stripped from each group value (Keycloak's full group paths start with "/").
    group_prefix: str = "/"
    # As `api.claims_carry_kinds`, for this provider's tokens.
    claims_carry_kinds: bool = False


class McpSettings(_Section):
    """`ki mcp`: the MCP server (apps.runtime.mcp_server). Over HTTP callers bring bearer tokens as for the API; over
    stdio there is no token, so the caller is `stdio_principals` (empty: nothing is visible)."""

    host: str = "127.0.0.1"
    port: int = Field(8765, ge=1, le=65535)
    path: str = Field("/mcp", pattern=r"^/[A-Za-z0-9/_-]*$")
    stdio_principals: list[str] = Field(default_factory=list)


# Where the local stack keeps its state when `stack.home` is not set (apps.dev.stack.settings uses it too).
LOCAL_STACK_HOME = "~/.cache/ki-sidecar"


class ToolSettings(_Section):
    """A section the runtime carries but does not read: the local stack's (`stack`, validated by its owner,
    `apps.dev.stack.settings.stack_settings`). Any field is accepted here; config values and `KI_STACK__*`
    variables arrive as given (a variable as JSON where it parses, else as text)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def given(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Settings(_Section):
    retrieval: RetrievalSettings = RetrievalSettings()
    database: DatabaseSettings = DatabaseSettings()
    kafka: KafkaSettings = KafkaSettings()
    connect: ConnectSettings = ConnectSettings()
    opensearch: OpenSearchSettings = OpenSearchSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    streams: StreamsSettings = StreamsSettings()
    security: SecuritySettings = SecuritySettings()
    api: ApiSettings = ApiSettings()
    oidc: OidcSettings = OidcSettings()
    mcp: McpSettings = McpSettings()
    stack: ToolSettings = ToolSettings()

    def lanes_data_dir(self) -> Path:
        """The sync lanes' own files: `streams.data_dir`, else `stack.home` (the local stack's home, which
        deployments set for this before `streams.data_dir` existed; the runtime reads nothing else of `stack`)."""
        return Path(self.streams.data_dir or self.stack.given().get("home") or LOCAL_STACK_HOME).expanduser()

    def secrets(self) -> list[str]:
        """Every secret value set (passwords, the JWT secret), longest first."""
        dump = self.model_dump()
        found = [_value(dump, path) for path, secret in _leaves(Settings) if secret]
        return sorted({v for v in found if v}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """`text` with every secret value replaced by `***` (for errors, status lines and logs). Values
        shorter than REDACT_MIN_CHARS are left: replacing a two-letter local password would maul every
        word containing it (and such a password protects nothing)."""
        for secret in self.secrets():
            if len(secret) >= REDACT_MIN_CHARS:
                text = text.replace(secret, "***")
        return text


def _is_plain_str(annotation: Any) -> bool:
    if annotation is str:  # also a `Secret`: pydantic hands the field's type without its Annotated metadata
        return True
    return get_origin(annotation) is Literal and all(isinstance(a, str) for a in get_args(annotation))


def _group_model(annotation: Any) -> type[_Group] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, _Group) else None


_ANY_TOOL_FIELD = FieldInfo.from_annotation(Any)


def _field_at(path: SettingPath) -> FieldInfo | None:
    """The field a path names (`("api", "jwt", "secret")`), walking sections and groups; None: no such setting."""
    model: type[BaseModel] = Settings
    info: FieldInfo | None = None
    for depth, name in enumerate(path):
        info = model.model_fields.get(name)
        if info is None:
            # a tool's section takes any single field; its owner validates it
            return _ANY_TOOL_FIELD if model is ToolSettings and depth == len(path) - 1 == 1 else None
        inner = info.annotation if depth == 0 else _group_model(info.annotation)  # a section, then groups
        if depth < len(path) - 1:
            if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
                return None
            model = inner
    return info


def dotted(path: SettingPath) -> str:
    return ".".join(path)


def _env_name(path: SettingPath) -> str:
    return ENV_PREFIX + "__".join(part.upper() for part in path)


def _lookup(data: dict[str, Any], path: SettingPath) -> tuple[dict[str, Any] | None, str]:
    """The dict that holds the path's last name (None where the path does not run through dicts), and that name."""
    node: Any = data
    for name in path[:-1]:
        node = node.get(name) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), path[-1]


def _place(data: dict[str, Any], path: SettingPath, value: Any) -> None:
    node = data
    for depth, name in enumerate(path[:-1]):
        child = node.setdefault(name, {})
        if not isinstance(child, dict):
            raise SettingsError(f"config error: {dotted(path[: depth + 1])}: must be an object")
        node = child
    node[path[-1]] = value


def _env_overrides(environ: dict[str, str]) -> list[tuple[SettingPath, Any]]:
    """`KI_<SECTION>__<FIELD>` / `KI_<SECTION>__<GROUP>__<FIELD>` variables as (path, value)."""
    overrides: list[tuple[SettingPath, Any]] = []
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = tuple(name[len(ENV_PREFIX) :].lower().split("__"))
        if path in RETIRED:
            log.warning("%s is ignored: %s was retired (%s)", name, dotted(path), RETIRED[path])
            continue
        if path in RENAMED:
            new_name = _env_name(RENAMED[path])
            if new_name in environ:
                raise SettingsError(f"{name}: set {new_name} only ({name} is its old name)")
            log.warning("%s is deprecated: use %s (same meaning)", name, new_name)
            path = RENAMED[path]
        field_info = _field_at(path)
        if field_info is None:
            if Settings.model_fields.get(path[0]) is None:
                raise SettingsError(f"{name}: unknown settings section {path[0]!r}")
            raise SettingsError(f"{name}: unknown setting {dotted(path)}")
        value: Any = raw
        if not _is_plain_str(field_info.annotation):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                annotation = field_info.annotation
                if get_origin(annotation) in (dict, list) or (
                    isinstance(annotation, type) and issubclass(annotation, BaseModel)
                ):
                    raise SettingsError(f"{name}: {dotted(path)} must be JSON ({exc.msg})") from None
        overrides.append((path, value))
    return overrides


def _migrate(data: dict[str, Any], where: str) -> None:
    """Drop retired settings and move renamed ones to their new names, in place, warning once for each."""
    for path, why in RETIRED.items():
        holder, name = _lookup(data, path)
        if holder is not None and name in holder:
            del holder[name]
            log.warning("%s: %s is ignored: the setting was retired (%s)", where, dotted(path), why)
    for old, new in RENAMED.items():
        holder, name = _lookup(data, old)
        if holder is None or name not in holder:
            continue
        target, new_name = _lookup(data, new)
        if target is not None and new_name in target:
            raise SettingsError(f"config error: {where}: set {dotted(new)} only ({dotted(old)} is its old name)")
        _place(data, new, holder.pop(name))
        log.warning("%s: %s is deprecated: use %s (same meaning)", where, dotted(old), dotted(new))


def _leaves(model: type[BaseModel], prefix: SettingPath = ()) -> list[tuple[SettingPath, bool]]:
    """Every setting's path below `model` (groups walked, not listed), and whether it is a secret."""
    out: list[tuple[SettingPath, bool]] = []
    secret = set(_secret_names(model))
    for name, info in model.model_fields.items():
        group = _group_model(info.annotation) if prefix else None
        section = info.annotation if not prefix else None
        if group is not None:
            out += _leaves(group, (*prefix, name))
        elif isinstance(section, type) and issubclass(section, BaseModel):
            out += _leaves(section, (name,))
        else:
            out.append(((*prefix, name), name in secret))
    return out


def _value(dump: dict[str, Any], path: SettingPath) -> Any:
    for name in path:
        dump = dump[name]
    return dump


def deviations(settings: Settings) -> dict[str, Any]:
    """The settings that differ from their class defaults, nested like config.json (what a minimal one holds)."""
    defaults = Settings().model_dump(mode="json")
    current = settings.model_dump(mode="json")
    out: dict[str, Any] = {}
    for path, _ in _leaves(Settings):
        if _value(current, path) != _value(defaults, path):
            _place(out, path, _value(current, path))
    return out


def changed_names(changed: dict[str, Any], prefix: SettingPath = ()) -> list[str]:
    """The dotted names of the settings in a `deviations` answer."""
    names: list[str] = []
    for name, value in changed.items():
        path = (*prefix, name)
        field_info = _field_at(path)
        group = field_info is not None and (len(path) == 1 or _group_model(field_info.annotation) is not None)
        walk = isinstance(value, dict) and group
        names += changed_names(value, path) if walk else [dotted(path)]
    return names


def reference(settings: Settings) -> list[str]:
    """Every setting as `section[.group].field = value`, with its default where the value differs; secrets
    shown as `***` (set or not is all it tells)."""
    defaults = Settings().model_dump(mode="json")
    current = settings.model_dump(mode="json")
    lines: list[str] = []
    for path, secret in _leaves(Settings):
        value, default = _value(current, path), _value(defaults, path)
        shown = "***" if secret and value else json.dumps(value, ensure_ascii=False)
        line = f"{dotted(path)} = {shown}"
        if default != value and not secret:
            line += f"  (default {json.dumps(default, ensure_ascii=False)})"
        lines.append(line)
    for name in Settings.model_fields:  # a tool's section: what is set of it (its owner knows the defaults)
        section = getattr(settings, name)
        if isinstance(section, ToolSettings):
            lines += [f"{name}.{key} = {json.dumps(v, ensure_ascii=False)}" for key, v in section.given().items()]
    return lines


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "<root>"
    msg = err["msg"].removeprefix("Value error, ")
    # A section-level check names the field itself ("text_analyzer: …"): join it onto the key.
    field, sep, rest = msg.partition(": ")
    if sep and re.fullmatch(r"[a-z_][a-z0-9_]*(\.[^\s.]+)*", field):
        key, msg = f"{key}.{field}", rest
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"config error: {key}: {msg}{more}"


def find_config(path: Path | str | None = None, environ: dict[str, str] | None = None) -> Path | None:
    """The config file in effect: `path` (`--config`), else `$KI_CONFIG`, else the first of
    `CONFIG_SEARCH_PATH` that exists (absolute, so a child process started elsewhere reads the same one);
    None: no file, the defaults alone. A named file is answered whether it exists or not."""
    named = path or (os.environ if environ is None else environ).get("KI_CONFIG")
    if named:
        return Path(named)
    return next((candidate.absolute() for candidate in CONFIG_SEARCH_PATH if candidate.is_file()), None)


def tuned_config() -> dict[str, Any]:
    """The project's tuned settings (`ki/tuned_config.json`, the repository's config.json shipped in the package:
    the local model's 384 dimensions, the German analyzer, the fusion chosen on the train splits), under every
    config file: the class defaults are the reference spec's, which a deployment should not start from."""
    from importlib import resources

    data: dict[str, Any] = json.loads((resources.files("ki") / "tuned_config.json").read_text(encoding="utf-8"))
    return data


def load_settings(path: Path | str | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Read the config file in effect (`find_config`: `path`, $KI_CONFIG, the search path; none: the tuned
    defaults alone) over the tuned defaults (`tuned_config`), apply env overrides, validate. A named file that is
    missing is an error."""
    environ = dict(os.environ if environ is None else environ)
    config_path = find_config(path, environ)
    environ.pop("KI_CONFIG", None)
    base = tuned_config()
    if config_path is None:
        return _validated(base, environ)
    try:
        data = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SettingsError(f"config error: {config_path}: file not found") from None
    except IsADirectoryError:
        raise SettingsError(f"config error: {config_path}: a folder, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SettingsError(f"config error: {config_path}: cannot read: {reason}") from None
    except json.JSONDecodeError as exc:
        raise SettingsError(f"config error: {config_path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"config error: {config_path}: top level must be an object")
    _migrate(data, str(config_path))
    try:
        settings_in_file = _override_paths(data)
    except SettingsError:
        return _validated(data, environ)  # the file's own mistake, worded as validating it says it
    for setting, value in settings_in_file:  # each setting the file names replaces the tuned one whole
        _place(base, setting, value)
    return _validated(base, environ)


def _validated(data: dict[str, Any], environ: dict[str, str]) -> Settings:
    """Settings from config data with the environment's `KI_*` variables applied over it."""
    for setting, value in _env_overrides(environ):
        _place(data, setting, value)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(_one_line(exc)) from None


def _override_paths(overrides: dict[str, Any], prefix: SettingPath = ()) -> list[tuple[SettingPath, Any]]:
    out: list[tuple[SettingPath, Any]] = []
    for name, value in overrides.items():
        path = (*prefix, name)
        field_info = _field_at(path)
        if field_info is None:
            if not prefix:
                raise SettingsError(f"config error: unknown settings section {name!r}")
            raise SettingsError(f"config error: unknown setting {dotted(path)}")
        walk = not prefix or _group_model(field_info.annotation) is not None
        if walk and not isinstance(value, dict):
            raise SettingsError(f"config error: {dotted(path)}: must be an object")
        out += _override_paths(value, path) if walk else [(path, value)]
    return out


def with_overrides(settings: Settings, overrides: dict[str, Any]) -> Settings:
    """`settings` with single fields replaced, validated like a config file (`model_copy(update=...)`
    would skip validation, so a typo'd or out-of-range override would slip through).

    `overrides` is nested like config.json (section -> [group ->] field -> value) and names only the
    fields it replaces; an unknown section, group or field is an error too."""
    data = settings.model_dump(mode="json")
    overrides = json.loads(json.dumps(overrides))  # a copy to migrate in place
    _migrate(overrides, "override")
    for setting, value in _override_paths(overrides):
        _place(data, setting, value)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(_one_line(exc)) from None


def with_environment(settings: Settings, environ: dict[str, str]) -> Settings:
    """`settings` with `KI_*` variables applied over it, as `load_settings` applies the process's own
    (a profile's env file over settings loaded from any config)."""
    return _validated(settings.model_dump(mode="json"), environ)
