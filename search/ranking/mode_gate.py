"""Evidence-gated hybrid search: the semantic leg runs by default only where a measurement says it helps.

A weak semantic leg fused with equal weight can push the right document down (on German text an
English embedder did exactly that). So the service does not assume hybrid is better: `ki eval` writes
reports, each bound by hashes to what it measured —

* `dataset_sha256`: the corpus, query and judgment files;
* `embedding_signature`: model + dimension (the index is bound to it too);
* `analyzer_hash`: the analysis chain and the text normalisation rules (what the lexical leg sees);
* `ranking_hash`: fusion weights, `rrf_k`, status boosts, chunking and collapse settings (what turns
  the legs into a ranking) —

and the service loads the reports from `retrieval.mode_gate.reports_dir` at start-up (default: the reports shipped
in this package, `gate_reports/`: copies of the committed `benchmarks/` reports the gate reads). Semantic is on
by default only when at least one report matches the service's own embedding signature, analyzer and ranking
hashes, and no matching report shows hybrid significantly below lexical (nDCG@10). Otherwise the default
is keyword-only and every response says why, and a request that names hybrid or semantic itself is refused
with that reason (409 `mode_unavailable`) unless `retrieval.mode_gate.explicit_without_evidence` is "honour".

The deployment's own evidence comes first: the newest `ki eval --self` report (apps.dev.eval.self_check, kept
in PostgreSQL and re-read by every API process every `retrieval.mode_gate.self_eval_refresh_s`) decides when it
matches these settings. An operator can pin the default instead (`retrieval.default_mode`).

Only evidence that cannot have been edited counts (`Trust`, ki.evidence_keys): a report file whose SHA-256 the
package pins (the reports shipped with this version, `PINNED_REPORTS`) or that a key the deployment trusts signed,
and whose measured latency, memory and index size are within `retrieval.mode_gate.max_*`; a self-eval report only
when signed. Anything else is no evidence (keyword-only), logged once with the reason.

Pure apart from `load_reports` (reads files) and `Trust.of` (reads key files); the self-eval row is read in
`search.ranking.sql_reads.load_self_evidence`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from ki.analysis import canonical, used_analysis
from ki.errors import PermanentError
from ki.evidence_keys import load_public_key, unverified_reason
from ki.settings import RetrievalSettings, Settings
from projections.text import NORMALISATION_VERSION
from search.ranking.legs import REGISTRY
from search.ranking.synonyms import DEFAULT_SYNONYMS

log = logging.getLogger(__name__)

Mode = Literal["hybrid", "lexical", "semantic"]
MODES: tuple[Mode, ...] = ("hybrid", "lexical", "semantic")

# What decides a ranking besides the index contents; any change invalidates a report. Each registered leg's
# weight is bound by its registration (a new leg's weight enters with it; the hash's keys are sorted).
RANKING_FIELDS: tuple[str, ...] = (
    "fusion_rrf_k",
    *(leg.weight_key for leg in REGISTRY),
    "version_status_boost",
    "chunk_chars",
    "chunk_overlap_chars",
    "chunk_contextualize",
    "profile_embeddings",
    "clause_embeddings",
    "collapse_per_document",
    "max_chunks_per_document",
)
METRIC = "ndcg@10"
#: `retrieval.promoted_bonus` as shipped: bound into the ranking hash only when set otherwise.
PROMOTED_BONUS_DEFAULT: float = RetrievalSettings.model_fields["promoted_bonus"].default

#: The reports shipped in the package (`gate_reports/`), by the SHA-256 of their files: editing one byte of a shipped
#: report makes it no evidence. A new release re-measures them and pins the new files here.
PINNED_REPORTS: dict[str, str] = {
    "dated-de.json": "0c7eccb5c70cf301be5566b123c7437ebec6dfdc29982ef5554bce4f01a353d0",
    "dated-de-words-off.json": "4ae82af321ef8e882709875c21c387c32ca802f433f9624b58e0960db6be2c49",
    "gesetze-headings-dev.json": "c4b21db4d27053aed25e18075ff55c6e45edadfe730025a22da9f68eaa2cb13e",
    "scifact-english.json": "0212e2ea6ba751f20947aace749ecbbb29cf71a052107d8e99a7fdb08b2a92e5",
    "xquad-de.json": "3458860a56a3c4ba82d4a4709deb19aeb46866c9f827d93a68432aebb45f9f61",
}


@dataclass(frozen=True)
class Trust:
    """Which evidence counts: pinned report files, reports signed by these keys, and what a report measured
    within these bounds (`retrieval.mode_gate`). `Trust()`: the pinned files alone, no bounds."""

    keys: tuple[Any, ...] = ()  # Ed25519 public keys
    max_p99_ms: float | None = None
    max_rss_mb: float | None = None
    max_index_bytes: int | None = None

    @classmethod
    def of(cls, settings: Settings) -> Trust:
        g = settings.retrieval.mode_gate
        keys = tuple(load_public_key(path) for path in g.trusted_key_files)
        return cls(keys, g.max_p99_ms, g.max_rss_mb, g.max_index_bytes)

    def refusal(self, data: dict[str, Any], file_sha256: str | None = None) -> str | None:
        """None when `data` counts as evidence; else why not. `file_sha256`: of the file it was read from."""
        if file_sha256 is None or file_sha256 not in PINNED_REPORTS.values():
            why = unverified_reason(data, self.keys)
            if why is not None:
                return f"{why} and not a pinned report"
        return self.over_bounds(data)

    def over_bounds(self, data: dict[str, Any]) -> str | None:
        cost = data.get("cost") if isinstance(data.get("cost"), dict) else {}
        figures = {
            "max_p99_ms": (self.max_p99_ms, _figure(cost, "latency_ms", "hybrid", "p99"), "hybrid p99 {} ms"),
            "max_rss_mb": (self.max_rss_mb, _figure(cost, "peak_rss_mb"), "peak RSS {} MB"),
            "max_index_bytes": (self.max_index_bytes, _figure(cost, "index", "bytes"), "index {} bytes"),
        }
        for name, (bound, measured, what) in figures.items():
            if bound is None:
                continue
            if measured is None:
                return f"it measured no {what.format('').strip()}, and retrieval.mode_gate.{name} is set"
            if measured > bound:
                return f"{what.format(measured)} exceeds retrieval.mode_gate.{name} {bound}"
        return None


def _figure(data: Any, *path: str) -> float | None:
    for name in path:
        data = data.get(name) if isinstance(data, dict) else None
    return float(data) if isinstance(data, int | float) and not isinstance(data, bool) else None


def _digest(value: Any, length: int) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:length]


def analyzer_definition(retrieval: RetrievalSettings) -> dict[str, Any]:
    """The analyzer by name, its custom definition if any, and the normalisation rules' version."""
    used = used_analysis(retrieval.text_analyzer, retrieval.text_analysis.as_map())
    return {
        "text_analyzer": retrieval.text_analyzer,
        "text_analysis": canonical(used),
        "normalisation": NORMALISATION_VERSION,
    }


def analyzer_hash(retrieval: RetrievalSettings) -> str:
    return _digest(analyzer_definition(retrieval), 12)


def ranking_hash(retrieval: RetrievalSettings, embedding_signature: str | None = None) -> str:
    """What turns the legs into a ranking; with a signature, only the relevance floor stored for it counts."""
    fields = {name: getattr(retrieval, name) for name in RANKING_FIELDS}
    # Ranking steps added later enter only when on: off, they change nothing, so reports measured before
    # they existed still hold.
    if retrieval.fusion_method != "rrf":
        fields["fusion_method"] = retrieval.fusion_method
    if retrieval.decay_enabled:
        fields["decay_floor"] = retrieval.decay_min_weight  # its old name: the hash of reports stays
    if retrieval.semantic_floor_enabled:
        floors = retrieval.semantic_floor
        fields["semantic_floor"] = floors if embedding_signature is None else floors.get(embedding_signature)
        if retrieval.semantic_floor_gates_answer:  # enters only when on (reports measured before it still hold)
            fields["semantic_floor_gates_answer"] = True
    if retrieval.answer_coverage_gate_enabled:  # enters only when on (reports measured before it still hold)
        gate = retrieval.answer_coverage_gate
        bars = gate.similarity if embedding_signature is None else gate.similarity.get(embedding_signature)
        fields["answer_coverage_gate"] = [bars, gate.min_coverage, gate.hits]
    if retrieval.graph_rag_enabled:
        r = retrieval
        fields["graph_rag"] = [r.graph_rag.seeds, r.graph_rag.max_added, r.graph_rag.hop_penalty]
    # The promoted bonus enters only when it differs from the shipped default: the shipped reports were measured on
    # corpora without promoted documents (`ki eval` loads none), where any bonus changes nothing, and the default
    # is what this version ranks with.
    if retrieval.promoted_bonus != PROMOTED_BONUS_DEFAULT:
        fields["promoted_bonus"] = retrieval.promoted_bonus
    if retrieval.synonyms_enabled:  # None: the shipped list, as it is in this version
        fields["synonyms"] = retrieval.synonyms if retrieval.synonyms is not None else DEFAULT_SYNONYMS
    return _digest(fields, 12)


def binding_for(settings: Settings, embedding_signature: str, dataset_sha256: str) -> dict[str, str]:
    """What a report was measured with; `binding_hash` of it goes into the report beside it."""
    return {
        "dataset_sha256": dataset_sha256,
        "embedding_signature": embedding_signature,
        "analyzer_hash": analyzer_hash(settings.retrieval),
        "ranking_hash": ranking_hash(settings.retrieval, embedding_signature),
    }


def binding_hash(binding: dict[str, str]) -> str:
    return _digest(binding, 16)


@dataclass(frozen=True)
class EvidenceReport:
    """The part of a `ki eval` report the gate reads."""

    path: str
    dataset: str
    binding: dict[str, str]
    lexical: float
    hybrid: float
    # The paired test's p-value of hybrid against lexical over the report's queries (None: an older report).
    p_value: float | None = None

    def matches(self, settings: Settings, embedding_signature: str) -> bool:
        return binding_matches(self.binding, settings, embedding_signature)


def binding_matches(binding: dict[str, str], settings: Settings, embedding_signature: str) -> bool:
    """Was the evidence measured with this embedder, analyzer and ranking?"""
    return (
        binding.get("embedding_signature") == embedding_signature
        and binding.get("analyzer_hash") == analyzer_hash(settings.retrieval)
        and binding.get("ranking_hash") == ranking_hash(settings.retrieval, embedding_signature)
    )


@dataclass(frozen=True)
class SelfEvidence:
    """The newest `ki eval --self` report: the deployment's own pseudo-queries (apps.dev.eval.self_check)."""

    report_id: int
    at: str
    binding: dict[str, str]
    decision: Mode
    summary: str  # the figures behind the decision, one clause

    @property
    def name(self) -> str:
        return f"self-eval #{self.report_id} ({self.at})"

    def matches(self, settings: Settings, embedding_signature: str) -> bool:
        return binding_matches(self.binding, settings, embedding_signature)


_REFUSED_SELF: set[int] = set()  # self-eval reports already logged as refused (read again every refresh)


def parse_self_report(
    report_id: int, at: str, decision: str, data: Any, trust: Trust | None = None
) -> SelfEvidence | None:
    """The stored report as evidence; None (logged once) when it is not signed by a trusted key, its binding does
    not verify or it lacks a summary. `trust` None: the signature is not asked for (tests of the rest)."""
    if not isinstance(data, dict) or decision not in ("hybrid", "lexical"):
        return None
    why = trust.refusal(data) if trust is not None else None
    if why is not None:
        if report_id not in _REFUSED_SELF:
            _REFUSED_SELF.add(report_id)
            log.warning("evidence: ignoring self-eval #%s: %s", report_id, why)
        return None
    binding = data.get("binding")
    if not isinstance(binding, dict) or data.get("binding_hash") != binding_hash(binding):
        log.warning("evidence: ignoring self-eval #%s: binding_hash does not match its binding", report_id)
        return None
    summary = data.get("summary")
    if not isinstance(summary, str) or not summary:
        return None
    mode: Mode = "hybrid" if decision == "hybrid" else "lexical"
    return SelfEvidence(report_id, at, {k: str(v) for k, v in binding.items()}, mode, summary)


class ReportInvalid(PermanentError):
    """A file that claims to be an eval report but cannot be used as evidence."""


def parse_report(path: str, data: Any) -> EvidenceReport | None:
    """The report in `data`, None when it is no eval report (other benchmarks share the folder).

    Raises `ReportInvalid` when it has a binding that does not verify (edited by hand) or lacks the
    lexical / hybrid figures."""
    if not isinstance(data, dict) or "binding" not in data:
        return None
    binding = data.get("binding")
    if not isinstance(binding, dict) or data.get("binding_hash") != binding_hash(binding):
        raise ReportInvalid(f"{path}: binding_hash does not match its binding (edited after `ki eval` wrote it?)")
    try:
        lexical = float(data["results"]["lexical"][METRIC])
        hybrid = float(data["results"]["hybrid"][METRIC])
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportInvalid(f"{path}: no lexical and hybrid {METRIC} in results ({exc})") from None
    dataset = data.get("dataset")
    name = dataset.get("name") if isinstance(dataset, dict) else dataset
    paired = data.get("hybrid_vs_lexical")
    p_value = paired.get("p_value") if isinstance(paired, dict) else None
    return EvidenceReport(
        path,
        str(name or Path(path).stem),
        {k: str(v) for k, v in binding.items()},
        lexical,
        hybrid,
        float(p_value) if isinstance(p_value, int | float) else None,
    )


#: The reports shipped in the package: package data, wherever the package is installed.
SHIPPED_REPORTS = "gate_reports"


def resolve_dir(directory: str | None) -> Path:
    """The reports folder: `directory` (relative: from the working folder), or None: the shipped reports."""
    if directory is None:
        return Path(str(files(__package__) / SHIPPED_REPORTS))
    return Path(directory).expanduser()


def load_reports(directory: str | None, trust: Trust) -> list[EvidenceReport]:
    """Every usable report in `directory` (`*.json`, not recursive; None: the shipped ones) that `trust` accepts;
    the others are logged (once: this runs at start-up) and skipped."""
    folder = resolve_dir(directory)
    if not folder.is_dir():
        return []
    reports: list[EvidenceReport] = []
    for file in sorted(folder.glob("*.json")):
        try:
            raw = file.read_bytes()
            data = json.loads(raw.decode("utf-8"))
            found = parse_reports(str(file), data)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ReportInvalid) as exc:
            log.warning("evidence: ignoring %s: %s", file, exc)
            continue
        why = trust.refusal(data, hashlib.sha256(raw).hexdigest()) if found else None
        if why is not None:
            log.warning("evidence: ignoring %s: %s", file, why)
            continue
        reports.extend(found)
    return reports


def parse_reports(path: str, data: Any) -> list[EvidenceReport]:
    """The report in `data` and its `variants`: the same run measured with one ranking feature switched
    from its default (`ki eval --features`), each bound to its own ranking hash, so switching that feature
    on keeps the evidence the run gathered for it."""
    main = parse_report(path, data)
    if main is None:
        return []
    out = [main]
    for variant in data.get("variants") or []:
        name = variant.get("name") if isinstance(variant, dict) else None
        found = parse_report(f"{path}#{name}", {"dataset": f"{main.dataset} ({name})", **variant})
        if found is not None:
            out.append(found)
    return out


@dataclass(frozen=True)
class GateDecision:
    """The default mode and the sentence that explains it (in every response and in `explain`)."""

    default_mode: Mode
    reason: str
    reports: tuple[str, ...] = ()
    # Whether evidence shows vectors help (None: not judged -- the operator pinned the default, or the semantic
    # leg is off): an explicit hybrid or semantic request without it is refused (search.plan.resolve_mode).
    vectors_proven: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {"default_mode": self.default_mode, "reason": self.reason, "reports": list(self.reports),
                "vectors_proven": self.vectors_proven}  # fmt: skip


def decide(
    reports: Sequence[EvidenceReport],
    settings: Settings,
    embedding_signature: str,
    own: SelfEvidence | None = None,
) -> GateDecision:
    """The operator's pin (`retrieval.default_mode`) if any; else the deployment's own self-eval report
    when it matches these settings; else hybrid iff a matching `ki eval` report exists and none of the
    matching ones has hybrid < lexical significantly (`retrieval.mode_gate.significance_level`; a report
    without a paired test: any difference)."""
    r = settings.retrieval
    if r.weight_semantic <= 0:
        return GateDecision("lexical", "the semantic leg is switched off (retrieval.weight_semantic is 0)")
    if r.default_mode != "auto":
        return GateDecision(r.default_mode, f"pinned by the operator (retrieval.default_mode {r.default_mode!r})")
    if own is not None and own.matches(settings, embedding_signature):
        # Callers read the reason: no figures from the report, which measured every document, also those
        # a caller may not see (its query counts tell the corpus size). Operators read them in the report.
        verdict = "keyword-only" if own.decision == "lexical" else "hybrid not significantly worse than keyword-only"
        return GateDecision(
            own.decision,
            f"this deployment's own evaluation, {own.name}: {verdict}",
            (own.name,),
            vectors_proven=own.decision == "hybrid",
        )
    matching = [rep for rep in reports if rep.matches(settings, embedding_signature)]
    if not matching:
        return GateDecision(
            "lexical",
            f"no evaluation report matches these settings (model {embedding_signature}, analyzer "
            f"{analyzer_hash(r)}, ranking {ranking_hash(r, embedding_signature)}): keyword-only until `ki eval` "
            "shows hybrid helps",
            vectors_proven=False,
        )
    names = tuple(rep.dataset for rep in matching)
    level = r.mode_gate.significance_level
    below = [rep for rep in matching if rep.hybrid < rep.lexical]
    worse = [rep for rep in below if rep.p_value is None or rep.p_value < level]
    if worse:
        detail = ", ".join(f"{w.dataset} {w.hybrid:.3f} < {w.lexical:.3f}" for w in worse)
        reason = f"hybrid ranked below lexical ({METRIC}) on {detail}: keyword-only"
        return GateDecision("lexical", reason, names, vectors_proven=False)
    detail = ", ".join(
        f"{m.dataset} {m.hybrid:.3f} >= {m.lexical:.3f}"
        if m.hybrid >= m.lexical
        else f"{m.dataset} {m.hybrid:.3f} < {m.lexical:.3f} not significantly (p {m.p_value:.3f} >= {level})"
        for m in matching
    )
    reason = f"hybrid ranked at least as well as lexical ({METRIC}) on {detail}"
    return GateDecision("hybrid", reason, names, vectors_proven=True)
