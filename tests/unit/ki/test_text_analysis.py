"""`retrieval.text_analysis`: validation at start-up, the definition hash in the index name, the index body."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ki.analysis import analysis_digest, check_analysis
from ki.settings import Settings, SettingsError, load_settings
from projections.mapping import analyzer_mismatch, index_body, index_signature, physical_index_name, text_analysis

LIGHT_GERMAN = {
    "filter": {
        "de_stop": {"type": "stop", "stopwords": "_german_"},
        "de_stem": {"type": "stemmer", "language": "light_german"},
    },
    "analyzer": {
        "de_text": {
            "type": "custom",
            "tokenizer": "standard",
            "filter": ["icu_normalizer", "de_stop", "german_normalization", "de_stem"],
        }
    },
}


def settings_with(analysis: dict, analyzer: str = "de_text") -> Settings:
    return Settings.model_validate({"retrieval": {"text_analyzer": analyzer, "text_analysis": analysis}})


def config_error(tmp_path: Path, retrieval: dict, environ: dict[str, str] | None = None) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"retrieval": retrieval}))
    with pytest.raises(SettingsError) as info:
        load_settings(path, environ=environ or {})
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_defined_analyzer_is_accepted_and_a_built_in_needs_no_definition() -> None:
    assert settings_with(LIGHT_GERMAN).retrieval.text_analyzer == "de_text"
    assert settings_with({}, analyzer="german").retrieval.text_analysis.as_map()["analyzer"] == {}


def test_unknown_keys_are_refused_naming_the_key(tmp_path: Path) -> None:
    message = config_error(tmp_path, {"text_analysis": {"filters": {}}})
    assert message.startswith("config error: retrieval.text_analysis.filters:")


def test_an_unknown_analyzer_is_refused(tmp_path: Path) -> None:
    message = config_error(tmp_path, {"text_analyzer": "de_text"})
    assert message.startswith("config error: retrieval.text_analyzer: 'de_text' is neither a built-in")


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda a: a["analyzer"]["de_text"]["filter"].append("nope"), "text_analysis.analyzer.de_text.filter"),
        (lambda a: a["analyzer"]["de_text"].update(tokenizer="nope"), "text_analysis.analyzer.de_text.tokenizer"),
        (lambda a: a["analyzer"]["de_text"].update(char_filter=["nope"]), "text_analysis.analyzer.de_text.char_filter"),
        (lambda a: a["analyzer"]["de_text"].pop("tokenizer"), "text_analysis.analyzer.de_text.tokenizer"),
        (lambda a: a["filter"]["de_stem"].update(type="no_such_type"), "text_analysis.filter.de_stem.type"),
        (lambda a: a["analyzer"].update(german={"tokenizer": "standard"}), "text_analysis.analyzer.german"),
        (lambda a: a["filter"].update(lowercase={"type": "lowercase"}), "text_analysis.filter.lowercase"),
    ],
)
def test_bad_references_are_refused_in_one_line_naming_the_key(tmp_path: Path, change, key: str) -> None:
    analysis = json.loads(json.dumps(LIGHT_GERMAN))
    change(analysis)
    message = config_error(tmp_path, {"text_analyzer": "de_text", "text_analysis": analysis})
    assert message.startswith(f"config error: retrieval.{key}:"), message


def test_the_environment_overrides_the_definition_as_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{}")
    environ = {"KI_RETRIEVAL__TEXT_ANALYSIS": json.dumps(LIGHT_GERMAN), "KI_RETRIEVAL__TEXT_ANALYZER": "de_text"}
    settings = load_settings(path, environ=environ)
    assert settings.retrieval.text_analysis.filter["de_stem"] == {"type": "stemmer", "language": "light_german"}
    with pytest.raises(SettingsError, match="text_analysis must be JSON"):
        load_settings(path, environ={"KI_RETRIEVAL__TEXT_ANALYSIS": "{not json"})


def test_the_hash_is_canonical_key_order_and_number_spelling_do_not_matter() -> None:
    reordered = {
        "analyzer": {"de_text": dict(reversed(list(LIGHT_GERMAN["analyzer"]["de_text"].items())))},
        "filter": dict(reversed(list(LIGHT_GERMAN["filter"].items()))),
    }
    a, b = settings_with(LIGHT_GERMAN), settings_with(reordered)
    assert index_signature(a, "m@384") == index_signature(b, "m@384")
    assert physical_index_name(a, "m@384") == physical_index_name(b, "m@384")
    used = {"analyzer": {"x": {"tokenizer": "t"}}, "tokenizer": {"t": {"type": "ngram", "min_gram": 3}}}
    as_read_back = {"analyzer": {"x": {"tokenizer": "t"}}, "tokenizer": {"t": {"min_gram": "3", "type": "ngram"}}}
    assert analysis_digest("x", used) == analysis_digest("x", as_read_back)


def test_a_changed_definition_gets_another_index_name() -> None:
    changed = json.loads(json.dumps(LIGHT_GERMAN))
    changed["filter"]["de_stem"]["language"] = "minimal_german"
    a, b = settings_with(LIGHT_GERMAN), settings_with(changed)
    assert physical_index_name(a, "m@384") != physical_index_name(b, "m@384")
    assert index_signature(a, "m@384").startswith("m@384+de_text@")
    # A definition the analyzer does not use does not change the name.
    unused = json.loads(json.dumps(LIGHT_GERMAN))
    unused["filter"]["spare"] = {"type": "lowercase"}
    assert physical_index_name(settings_with(unused), "m@384") == physical_index_name(a, "m@384")


def test_a_built_in_analyzer_keeps_the_old_index_name() -> None:
    german = Settings.model_validate({"retrieval": {"text_analyzer": "german"}})
    assert index_signature(german, "m@384") == "m@384+german"
    # Definitions that the built-in analyzer does not use are not part of its index.
    unused = settings_with(LIGHT_GERMAN, analyzer="german")
    assert physical_index_name(unused, "m@384") == physical_index_name(german, "m@384")
    assert "analysis" not in index_body(unused)["settings"]["index"]


def test_the_index_body_carries_only_what_the_analyzer_uses() -> None:
    spare = json.loads(json.dumps(LIGHT_GERMAN))
    spare["filter"]["spare"] = {"type": "lowercase"}
    body = index_body(settings_with(spare))
    assert body["settings"]["index"]["analysis"] == LIGHT_GERMAN
    assert body["mappings"]["properties"]["text"] == {"type": "text", "analyzer": "de_text"}
    assert body["mappings"]["properties"]["identifiers_text"]["analyzer"] == "standard"


def test_a_changed_definition_under_the_same_name_is_a_mismatch() -> None:
    settings = settings_with(LIGHT_GERMAN)
    live_mapping = {"properties": {"text": {"type": "text", "analyzer": "de_text"}}}
    # What GET _settings returns for an index made from this body: scalars as strings, same structure.
    live_settings = {"idx": {"settings": {"index": {"analysis": LIGHT_GERMAN, "number_of_shards": "1"}}}}
    assert analyzer_mismatch(live_mapping, "de_text", text_analysis(settings), live_settings) is None
    changed = json.loads(json.dumps(LIGHT_GERMAN))
    changed["filter"]["de_stem"]["language"] = "minimal_german"
    message = analyzer_mismatch(live_mapping, "de_text", text_analysis(settings_with(changed)), live_settings)
    assert message and "ki rebuild" in message and "minimal_german" in message
    # A built-in analyzer against a live index that defines nothing: fine; without settings: name only.
    german_live = {"properties": {"text": {"type": "text", "analyzer": "german"}}}
    assert analyzer_mismatch(german_live, "german", {}, {"idx": {"settings": {"index": {}}}}) is None
    assert analyzer_mismatch(live_mapping, "de_text") is None


def test_check_analysis_accepts_the_built_in_names_only() -> None:
    check_analysis("german", {})
    with pytest.raises(ValueError, match="text_analyzer"):
        check_analysis("germanx", {})
