"""Promoted documents and expiry, the pure parts (migration 0013): the rows a promoted or expired document gets,
the sync's plan when the flag is taken back, the sweep's look-back, the bonus on the fused score and its binding
into the ranking hash."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from ki.settings import RetrievalSettings, load_settings
from projections.plan import RowWrite, expiry_sweep_since, row_write
from projections.rows import AccessProjection, DocumentState, VersionState, build_rows, expired
from search.ranking.fusion import Candidate, apply_boost, apply_promoted, fuse
from search.ranking.hits import FusionParams, explain_json
from search.ranking.legs import SOURCE_INCLUDES, LegHit
from search.ranking.mode_gate import PROMOTED_BONUS_DEFAULT, Trust, decide, load_reports, ranking_hash

SIGNATURE = "multilingual-e5-small-384"  # the shipped embedding model
NOW = datetime(2026, 12, 9, 12, 0, tzinfo=UTC)
DOC = DocumentState(id=7, project_id=3, title="Weisung Heckenhöhe", latest_final_version_id=42)
VERSION = VersionState(
    id=42, document_id=7, version_no=1, status="final", language="de", doc_date=date(2024, 3, 1),
    text="Die Hecke darf zwei Meter hoch sein. " * 20,
)  # fmt: skip
ACCESS = AccessProjection(allowed_principals=("user:a",), denied_principals=(), access_version=1)
SETTINGS = RetrievalSettings(chunk_chars=300, chunk_overlap_chars=30)


def rows(document: DocumentState, now: datetime | None = NOW) -> list[Any]:
    return build_rows(document, VERSION, doc_type_ancestors=(), doc_type_label=None, matter_title=None,
                      access=ACCESS, settings=SETTINGS, now=now)  # fmt: skip


# --- rows ----------------------------------------------------------------------------------------------


def test_an_expired_document_has_no_rows_and_one_expiring_later_has_them_all() -> None:
    live = rows(DOC)
    assert len(live) > 1
    assert rows(replace(DOC, expires_at=NOW + timedelta(seconds=1))) == live
    assert rows(replace(DOC, expires_at=NOW)) == []  # expired at the very instant
    assert rows(replace(DOC, expires_at=NOW - timedelta(days=1))) == []
    # Without a clock expiry is not judged (a caller that decides visibility elsewhere).
    assert rows(replace(DOC, expires_at=NOW - timedelta(days=1)), now=None) == live


def test_expired_compares_instants() -> None:
    assert not expired(DOC, NOW)
    assert expired(replace(DOC, expires_at=NOW - timedelta(microseconds=1)), NOW)
    assert not expired(replace(DOC, expires_at=NOW + timedelta(microseconds=1)), NOW)
    assert not expired(replace(DOC, expires_at=NOW - timedelta(days=1)), None)


def test_a_promoted_documents_rows_say_so_and_the_others_are_unchanged() -> None:
    plain, promoted = rows(DOC), rows(replace(DOC, promoted=True))
    assert all("promoted" not in r.source for r in plain)
    assert all(r.source["promoted"] is True for r in promoted)
    assert [(r.id, r.content_hash) for r in plain] == [(r.id, r.content_hash) for r in promoted]  # no re-embedding
    assert "promoted" in SOURCE_INCLUDES  # fusion reads it from the hit


@dataclass(frozen=True)
class Stored:
    doc_id: str
    content_hash: str
    access_version: int
    source: dict[str, Any]


def test_promoting_is_an_update_and_taking_it_back_replaces_the_rows() -> None:
    plain, promoted = rows(DOC)[0], rows(replace(DOC, promoted=True))[0]

    def stored(row: Any) -> Stored:
        return Stored(row.id, row.content_hash, 1, dict(row.source))

    assert row_write(promoted, stored(plain)) is RowWrite.UPDATE
    assert row_write(plain, stored(promoted)) is RowWrite.REPLACE  # a partial update cannot remove the field


def test_the_sweep_looks_back_one_interval_from_its_last_clock() -> None:
    assert expiry_sweep_since(None, 60) is None
    assert expiry_sweep_since(NOW, 60) == NOW - timedelta(seconds=60)


# --- ranking ------------------------------------------------------------------------------------------


def hit(chunk: str, document: int, **source: Any) -> LegHit:
    return LegHit(chunk, 1.0, {"document_id": str(document), "document_version_id": str(document),
                               "version_status": "final", **source})  # fmt: skip


def test_the_bonus_lifts_a_promoted_row_above_its_twin_after_fusion_and_boost() -> None:
    legs = {"lexical": [hit("1:chunk:0", 1), hit("2:chunk:0", 2, promoted=True), hit("3:chunk:0", 3)]}
    fused = apply_boost(fuse(legs, {"lexical": 1.0}, "rrf", 60), {"final": 1.0})
    assert [c.chunk_id for c in fused] == ["1:chunk:0", "2:chunk:0", "3:chunk:0"]
    ranked = apply_promoted(fused, 0.01)
    assert [c.chunk_id for c in ranked] == ["2:chunk:0", "1:chunk:0", "3:chunk:0"]
    assert [c.bonus for c in ranked] == [0.01, 0.0, 0.0]
    for c in ranked:
        assert c.score == pytest.approx(sum(c.parts.values()) * c.boost * c.decay + c.bonus)
    assert apply_promoted(fused, 0.0) == fused  # off: nothing changes


def test_the_bonus_is_small_against_a_clearly_better_match() -> None:
    legs = {"lexical": [hit("1:chunk:0", 1), hit("2:chunk:0", 2, promoted=True)],
            "identifier": [hit("1:chunk:0", 1)]}  # fmt: skip
    ranked = apply_promoted(fuse(legs, {"lexical": 1.0, "identifier": 1.5}, "rrf", 60), 0.01)
    assert [c.chunk_id for c in ranked] == ["1:chunk:0", "2:chunk:0"]


def test_explain_shows_the_bonus() -> None:
    c = Candidate("2:chunk:0", 0.03, {"document_id": "2"}, {"lexical": 0}, {"lexical": 0.02}, bonus=0.01)
    explained = explain_json(c, FusionParams({"lexical": 1.0}, 60))
    assert explained["promoted_bonus"] == 0.01 and explained["fused_score"] == 0.03


def test_the_bonus_enters_the_ranking_hash_only_when_it_differs_from_the_shipped_default() -> None:
    shipped = RetrievalSettings()
    assert shipped.promoted_bonus == PROMOTED_BONUS_DEFAULT == 0.01
    # The shipped reports (measured on corpora without promoted documents) hold for the shipped bonus ...
    settings = load_settings(environ={})
    found = load_reports(settings.retrieval.mode_gate.reports_dir, Trust.of(settings))
    assert decide(found, settings, SIGNATURE).default_mode == "hybrid"
    other = settings.model_copy(update={"retrieval": settings.retrieval.model_copy(update={"promoted_bonus": 0.02})})
    assert decide(found, other, SIGNATURE).default_mode == "lexical"  # measured with another ranking: no evidence
    # ... and any other bonus, none included, is another ranking.
    hashes = {ranking_hash(shipped.model_copy(update={"promoted_bonus": b})) for b in (0.0, 0.01, 0.02, 0.5)}
    assert len(hashes) == 4
