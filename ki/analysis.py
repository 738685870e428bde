"""The text-analysis chain of the chunk index's `text` field: built-in names and the definition it uses.

`retrieval.text_analyzer` names the analyzer; `retrieval.text_analysis` may define it (and the char
filters, tokenizer and filters it uses) in OpenSearch's index `analysis` shape. The names below are the
built-ins a definition may reference, each checked with `_analyze` against the stack's OpenSearch 2.19
(analysis-common plus the ICU components: `ki-analysis-icu` natively, `analysis-icu` under compose).
Pure functions only: settings validation and the index mapping both use them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

ANALYSIS_KINDS: tuple[str, ...] = ("char_filter", "tokenizer", "filter", "analyzer")

#: Analyzers usable by name, without a definition.
BUILTIN_ANALYZERS: frozenset[str] = frozenset(
    {
        "standard", "simple", "whitespace", "stop", "keyword", "pattern", "fingerprint",
        "arabic", "armenian", "basque", "bengali", "brazilian", "bulgarian", "catalan", "cjk", "czech",
        "danish", "dutch", "english", "estonian", "finnish", "french", "galician", "german", "greek",
        "hindi", "hungarian", "indonesian", "irish", "italian", "latvian", "lithuanian", "norwegian",
        "persian", "portuguese", "romanian", "russian", "sorani", "spanish", "swedish", "thai", "turkish",
    }
)  # fmt: skip

#: Components usable by name in a custom analyzer (pre-configured, no parameters).
BUILTIN_REFERENCES: dict[str, frozenset[str]] = {
    "char_filter": frozenset({"html_strip", "icu_normalizer"}),
    "tokenizer": frozenset(
        {"standard", "whitespace", "keyword", "letter", "lowercase", "classic", "uax_url_email", "thai",
         "icu_tokenizer"}
    ),
    "filter": frozenset(
        {"lowercase", "uppercase", "asciifolding", "apostrophe", "elision", "german_normalization", "german_stem",
         "scandinavian_folding", "decimal_digit", "cjk_width", "trim", "unique", "remove_duplicates",
         "word_delimiter", "word_delimiter_graph", "flatten_graph", "keyword_repeat", "porter_stem", "kstem",
         "snowball", "stemmer", "stop", "shingle", "icu_normalizer", "icu_folding"}
    ),
}  # fmt: skip

#: Types a definition in `text_analysis.<kind>` may have (components configured with parameters).
BUILTIN_TYPES: dict[str, frozenset[str]] = {
    "char_filter": frozenset({"html_strip", "mapping", "pattern_replace", "icu_normalizer"}),
    "tokenizer": frozenset(
        {"standard", "whitespace", "keyword", "letter", "classic", "uax_url_email", "pattern", "simple_pattern",
         "char_group", "ngram", "edge_ngram", "path_hierarchy", "icu_tokenizer"}
    ),
    "filter": frozenset(
        {"lowercase", "asciifolding", "stop", "stemmer", "snowball", "stemmer_override", "keyword_marker",
         "word_delimiter", "word_delimiter_graph", "synonym", "synonym_graph", "pattern_replace", "length",
         "elision", "shingle", "ngram", "edge_ngram", "dictionary_decompounder", "hyphenation_decompounder",
         "unique", "truncate", "limit", "icu_normalizer", "icu_folding"}
    ),
    "analyzer": frozenset({"custom"}) | BUILTIN_ANALYZERS,
}  # fmt: skip


def _names(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def check_analysis(analyzer: str, analysis: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> None:
    """Raise ValueError (one line naming the key) unless `analyzer` is built-in or fully defined."""
    for kind in ANALYSIS_KINDS:
        for name, definition in analysis.get(kind, {}).items():
            key = f"text_analysis.{kind}.{name}"
            kind_type = definition.get("type", "custom" if kind == "analyzer" else None)
            if kind_type not in BUILTIN_TYPES[kind]:
                raise ValueError(f"{key}.type: {kind_type!r} is not a known {kind} type")
            if kind == "analyzer" and name in BUILTIN_ANALYZERS:
                raise ValueError(f"{key}: shadows the built-in analyzer {name!r}; give the definition another name")
            if kind != "analyzer" and name in BUILTIN_REFERENCES[kind]:
                raise ValueError(f"{key}: shadows the built-in {kind} {name!r}; give the definition another name")
    for name, definition in analysis.get("analyzer", {}).items():
        if definition.get("type", "custom") != "custom":
            continue
        key = f"text_analysis.analyzer.{name}"
        if "tokenizer" not in definition:
            raise ValueError(f"{key}.tokenizer: a custom analyzer needs a tokenizer")
        for kind in ("char_filter", "tokenizer", "filter"):
            for ref in _names(definition.get(kind)):
                if ref not in BUILTIN_REFERENCES[kind] and ref not in analysis.get(kind, {}):
                    raise ValueError(
                        f"{key}.{kind}: {ref!r} is neither defined in text_analysis.{kind} nor a built-in {kind}"
                    )
    if analyzer not in BUILTIN_ANALYZERS and analyzer not in analysis.get("analyzer", {}):
        raise ValueError(
            f"text_analyzer: {analyzer!r} is neither a built-in analyzer nor defined in text_analysis.analyzer"
        )


def used_analysis(analyzer: str, analysis: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The part of `analysis` that `analyzer` uses, in the index `analysis` shape ({} for a built-in)."""
    definition = analysis.get("analyzer", {}).get(analyzer)
    if definition is None:
        return {}
    used: dict[str, Any] = {"analyzer": {analyzer: dict(definition)}}
    for kind in ("char_filter", "tokenizer", "filter"):
        defined = analysis.get(kind, {})
        picked = {ref: dict(defined[ref]) for ref in _names(definition.get(kind)) if ref in defined}
        if picked:
            used[kind] = picked
    return used


def canonical(value: Any) -> Any:
    """`value` as OpenSearch returns index settings: maps sorted, scalars as strings, one name as a list.

    A definition read back from a live index (where `"max_gram": 3` comes back as `"3"`) and the same
    definition from the settings compare and hash alike."""
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def analysis_digest(analyzer: str, used: Mapping[str, Any]) -> str:
    """8 hex digits of the canonical JSON of the analyzer name plus the definitions it uses."""
    body = {"analyzer": analyzer, "analysis": canonical(_listed(used))}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def _listed(used: Mapping[str, Any]) -> dict[str, Any]:
    """Analyzer `filter`/`char_filter` given as one string become one-element lists (as OpenSearch stores)."""
    out = {kind: dict(defs) for kind, defs in used.items()}
    for name, definition in out.get("analyzer", {}).items():
        fixed = dict(definition)
        for key in ("filter", "char_filter"):
            if isinstance(fixed.get(key), str):
                fixed[key] = [fixed[key]]
        out["analyzer"][name] = fixed
    return out


def comparable(used: Mapping[str, Any]) -> Any:
    """A form of a used-analysis map that equals the live index's when they define the same chain."""
    return canonical(_listed(used))
