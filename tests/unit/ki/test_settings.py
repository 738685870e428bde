import json
import logging
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from apps.dev.checkout import REPO_ROOT
from ki.settings import (
    RENAMED,
    Settings,
    SettingsError,
    _Group,
    deviations,
    load_settings,
    reference,
    with_overrides,
)

SPEC_RETRIEVAL_DEFAULTS = {
    "index_name": "knowledge-index-chunks-v1",
    "vector_engine": "lucene",
    "vector_space_type": "cosinesimil",
    "chunk_chars": 1200,
    "chunk_overlap_chars": 120,
    "chunk_contextualize": True,
    "profile_embeddings": True,
    "clause_embeddings": True,
    "fusion_rrf_k": 60,
    "weight_lexical": 1.0,
    "weight_identifier": 1.5,
    "version_status_boost": {"executed": 1.2, "final": 1.0, "unknown": 0.8, "draft": 0.7},
    "collapse_per_document": True,
    "max_chunks_per_document": 3,
    "rerank_enabled": False,
    "graph_rag_enabled": False,
}


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_config_json_holds_only_deliberate_deviations() -> None:
    on_disk = json.loads((REPO_ROOT / "config.json").read_text())
    shipped = load_settings(environ={})
    assert on_disk == deviations(shipped)  # nothing that repeats a default, nothing unknown
    assert sorted(f"{s}.{f}" for s, fields in on_disk.items() for f in fields) == [
        "embedding.threads",
        "retrieval.embedding_dimensions",
        "retrieval.fusion_method",
        "retrieval.hnsw_ef_construction",
        "retrieval.hnsw_m",
        "retrieval.semantic_floor",
        "retrieval.semantic_floor_enabled",
        "retrieval.text_analysis",
        "retrieval.text_analyzer",
        "retrieval.weight_semantic",
    ]


def test_a_retired_setting_is_ignored_with_one_warning_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path, {"retrieval": {"weight_decisions": 0.8, "fusion_rrf_k": 40}})
    with caplog.at_level(logging.WARNING, logger="ki.settings"):
        settings = load_settings(path, environ={"KI_RETRIEVAL__WEIGHT_DECISIONS": "0.5"})
    assert settings.retrieval.fusion_rrf_k == 40 and not hasattr(settings.retrieval, "weight_decisions")
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and all("weight_decisions" in w and "\n" not in w for w in warned)


def test_a_renamed_setting_still_works_under_its_old_name_with_one_warning_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path, {"retrieval": {"identity_max_candidates": 7}, "api": {"identity_cache_keys": 10}})
    with caplog.at_level(logging.WARNING, logger="ki.settings"):
        settings = load_settings(path, environ={"KI_RETRIEVAL__EVIDENCE_SIGNIFICANCE_LEVEL": "0.01"})
    assert settings.retrieval.name_lookup.max_candidates == 7 and settings.api.caches.name_keys == 10
    assert settings.retrieval.mode_gate.significance_level == 0.01
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and all("deprecated" in w and "\n" not in w for w in warned)
    assert any("KI_RETRIEVAL__MODE_GATE__SIGNIFICANCE_LEVEL" in w for w in warned)
    # A newer variable overrides an older file's old name: the file is migrated first.
    newer = load_settings(path, environ={"KI_RETRIEVAL__NAME_LOOKUP__MAX_CANDIDATES": "3"})
    assert newer.retrieval.name_lookup.max_candidates == 3
    assert with_overrides(settings, {"retrieval": {"decay_floor": 0.5}}).retrieval.decay_min_weight == 0.5


def test_a_setting_given_under_both_names_in_one_place_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, {"retrieval": {"evidence_dir": "a", "mode_gate": {"reports_dir": "b"}}})
    with pytest.raises(SettingsError, match=r"set retrieval.mode_gate.reports_dir only"):
        load_settings(path, environ={})
    both = {"KI_API__IDENTITY_CACHE_KEYS": "1", "KI_API__CACHES__NAME_KEYS": "2"}
    with pytest.raises(SettingsError, match=r"^KI_API__IDENTITY_CACHE_KEYS: set KI_API__CACHES__NAME_KEYS only"):
        load_settings(environ=both)


def _exists(dump: dict, path: tuple[str, ...]) -> bool:
    for name in path:
        if not isinstance(dump, dict) or name not in dump:
            return False
        dump = dump[name]
    return True


def test_every_renamed_setting_points_at_a_setting_and_no_longer_exists_itself() -> None:
    model = Settings().model_dump()
    for old, new in RENAMED.items():
        assert _exists(model, new), f"{old} -> {new}: no such setting"
        assert not _exists(model, old), f"{old} is still a setting"
        assert new not in RENAMED, f"{old} -> {new} -> {RENAMED.get(new)}: point at the newest name"


def _count_settings(model: BaseModel, top: bool = True) -> int:
    values = [getattr(model, name) for name in type(model).model_fields]
    return sum(_count_settings(v, False) if top or isinstance(v, _Group) else 1 for v in values)


def test_the_reference_lists_every_setting_with_its_default_and_hides_secrets() -> None:
    settings = load_settings(environ={"KI_API__JWT__SECRET": "a-secret-of-our-own-0123456789"})
    lines = reference(settings)
    assert len(lines) == _count_settings(Settings())
    assert 'retrieval.fusion_method = "minmax"  (default "rrf")' in lines
    assert "retrieval.fusion_rrf_k = 60" in lines
    assert "api.jwt.secret = ***" in lines and not any("a-secret-of-our-own" in line for line in lines)


def test_config_json_keeps_the_spec_retrieval_defaults() -> None:
    retrieval = load_settings(environ={}).retrieval.model_dump()
    for key, value in SPEC_RETRIEVAL_DEFAULTS.items():
        assert retrieval[key] == value, key
    # Deliberate deviations: the shipped local model is 384-d (the spec's 1536 is the HTTP provider); the
    # legs are fused by min-max with the semantic leg at 0.5, chosen on the train splits
    # (BENCHMARKS.md) -- the spec's weighted RRF with equal weights stays the class default.
    assert retrieval["embedding_dimensions"] == 384
    assert Settings().retrieval.embedding_dimensions == 1536
    assert (retrieval["fusion_method"], retrieval["weight_semantic"]) == ("minmax", 0.5)
    assert (Settings().retrieval.fusion_method, Settings().retrieval.weight_semantic) == ("rrf", 1.0)
    # A denser HNSW graph: at 100k chunks the spec's m 16 / ef_construction 128 miss a third of the true
    # ten nearest neighbours at any ef_search we could afford (BENCHMARKS.md, issue 32).
    assert (retrieval["hnsw_m"], retrieval["hnsw_ef_construction"]) == (32, 256)
    assert (Settings().retrieval.hnsw_m, Settings().retrieval.hnsw_ef_construction) == (16, 128)


def test_env_overrides_scalar_and_map() -> None:
    settings = load_settings(
        environ={
            "KI_RETRIEVAL__FUSION_RRF_K": "10",
            "KI_RETRIEVAL__VERSION_STATUS_BOOST": '{"final": 2.0}',
            "KI_SECURITY__SOURCE_ACL_MODE": "intersect",
            "KI_API__JWT__SECRET": "1234567890123456789",
        }
    )
    assert settings.retrieval.fusion_rrf_k == 10
    assert settings.retrieval.version_status_boost == {"final": 2.0}
    assert settings.security.source_acl_mode == "intersect"
    assert settings.api.jwt.secret == "1234567890123456789"


@pytest.mark.parametrize(
    ("environ", "needle"),
    [
        ({"KI_RETRIEVAL__NOPE": "1"}, "retrieval.nope"),
        ({"KI_NOPE__X": "1"}, "'nope'"),
        ({"KI_RETRIEVAL__CHUNK_OVERLAP_CHARS": "1200"}, "chunk_overlap_chars"),
        ({"KI_API__PORT": "70000"}, "api.port"),
        ({"KI_API__PORT": "abc"}, "api.port"),
        ({"KI_SECURITY__SOURCE_ACL_MODE": "maybe"}, "security.source_acl_mode"),
        ({"KI_RETRIEVAL__VERSION_STATUS_BOOST": "{not json"}, "must be JSON"),
        ({"KI_RETRIEVAL__VERSION_STATUS_BOOST": '{"final": -1}'}, "version_status_boost"),
    ],
)
def test_bad_values_fail_with_one_line_naming_the_key(environ: dict, needle: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(environ=environ)
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_unknown_key_in_file_is_rejected(tmp_path: Path) -> None:
    data = json.loads((REPO_ROOT / "config.json").read_text())
    data.setdefault("opensearch", {})["urll"] = "x"
    with pytest.raises(SettingsError, match=r"opensearch\.urll"):
        load_settings(_write(tmp_path, data), environ={})


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="file not found"):
        load_settings(tmp_path / "absent.json", environ={})
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(SettingsError, match="invalid JSON"):
        load_settings(broken, environ={})


def test_ki_config_env_selects_the_file(tmp_path: Path) -> None:
    data = json.loads((REPO_ROOT / "config.json").read_text())
    data.setdefault("api", {})["port"] = 9999
    path = _write(tmp_path, data)
    assert load_settings(environ={"KI_CONFIG": str(path)}).api.port == 9999


def test_security_principals_must_be_kind_colon_name(tmp_path: Path) -> None:
    for security in ({"admin_principals": ["root"]}, {"aliases": {"anna@kanzlei.de": "user:anna"}}):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({"security": security}))
        with pytest.raises(SettingsError, match="is not a principal: expected kind:name"):
            load_settings(path)
    path.write_text(json.dumps({"security": {"aliases": {" Mail:Anna@Kanzlei.de ": "USER:anna"}}}))
    assert load_settings(path).security.aliases == {" Mail:Anna@Kanzlei.de ": "USER:anna"}


def test_ki_config_check_lists_deviations_and_fails_on_an_unsafe_exposure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.cli import main

    assert main(["config", "check"]) == 0
    assert "retrieval.fusion_method" in capsys.readouterr().out
    monkeypatch.setenv("KI_API__HOST", "0.0.0.0")
    assert main(["config", "check"]) == 2
    captured = capsys.readouterr()
    assert "api.host" in captured.out and "api.jwt.secret" in captured.err and len(captured.err.splitlines()) == 1
    monkeypatch.setenv("KI_API__PORT", "not-a-port")
    assert main(["config", "check"]) == 2
    assert "api.port" in capsys.readouterr().err


def test_a_group_is_an_object_in_the_file_a_double_underscore_path_in_the_environment_and_overridden_by_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path, {"api": {"jwt": {"issuer": "firm-idp", "audience": "firm-api"}}})
    settings = load_settings(path, environ={"KI_API__JWT__SECRET": "a-secret-of-our-own-0123456789"})
    assert (settings.api.jwt.issuer, settings.api.jwt.audience) == ("firm-idp", "firm-api")
    assert settings.api.jwt.secret == "a-secret-of-our-own-0123456789"
    # An override names single fields: the group's other fields stay.
    off = with_overrides(settings, {"api": {"jwt": {"enabled": False}}})
    assert not off.api.jwt.enabled and off.api.jwt.issuer == "firm-idp"
    assert deviations(off)["api"] == {"jwt": {"enabled": False, "issuer": "firm-idp", "audience": "firm-api",
                                              "secret": "a-secret-of-our-own-0123456789"}}  # fmt: skip
    # The flat names from before the group still work, with one warning line each.
    flat = _write(tmp_path, {"api": {"jwt_issuer": "old-idp", "hmac_enabled": False}})
    with caplog.at_level(logging.WARNING, logger="ki.settings"):
        old = load_settings(flat, environ={"KI_API__JWT_AUDIENCE": "old-api"})
    assert (old.api.jwt.issuer, old.api.jwt.audience, old.api.jwt.enabled) == ("old-idp", "old-api", False)
    assert len(caplog.records) == 3 and any("KI_API__JWT__AUDIENCE" in r.getMessage() for r in caplog.records)
    for bad, named in [
        ({"KI_API__JWT__NOPE": "1"}, "unknown setting api.jwt.nope"),
        ({"KI_API__JWT__ENABLED__MORE": "1"}, "unknown setting api.jwt.enabled.more"),
        ({"KI_API__JWT__ALGORITHM": "RS256"}, "api.jwt.algorithm"),
    ]:
        with pytest.raises(SettingsError, match=re.escape(named)):
            load_settings(environ=bad)
    with pytest.raises(SettingsError, match=r"unknown setting api\.jwt\.nope"):
        with_overrides(settings, {"api": {"jwt": {"nope": 1}}})
    with pytest.raises(SettingsError, match=r"api\.jwt: must be an object"):
        with_overrides(settings, {"api": {"jwt": "off"}})
