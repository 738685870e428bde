"""Search requests and metadata filters, validated against the `api.*` limits.

Limits that depend on settings (query length, page size, values per filter) are read from the
validation context, so one model class serves every configuration: use `parse_search_request` /
`parse_filter_request` rather than `model_validate` directly.

The ranked window `offset + limit` is capped at `MAX_RANKED_WINDOW` (500). Exceeding it is not a
malformed request but one the service refuses to answer honestly (collapse and the SQL re-verify
shrink the candidate set after ranking), so it raises the distinct `WindowTooDeep` (HTTP 422).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from ki.errors import RequestInvalid
from ki.settings import ApiSettings, LimitsSettings
from projections.text import normalise_text

MAX_RANKED_WINDOW = 500
MAX_EVIDENCE_BUDGET = 10_000_000  # characters; the same bound as retrieval.evidence_budget_chars
#: Ids are PostgreSQL bigints; a larger number is bad input, not a database error.
MAX_ID = 2**63 - 1

VersionStatus = Literal["draft", "final", "executed", "unknown"]
ChunkKind = Literal["chunk", "profile", "clause"]
Id = Annotated[int, Field(ge=1, le=MAX_ID)]


class WindowTooDeep(RequestInvalid):
    """`offset + limit` exceeds the ranked window cap (`max_window`)."""

    def __init__(self, offset: int, limit: int) -> None:
        self.offset, self.limit, self.max_window = offset, limit, MAX_RANKED_WINDOW
        message = f"offset + limit = {offset + limit} exceeds the maximum ranked window of {MAX_RANKED_WINDOW}"
        super().__init__("offset", message)


def _limits(info: ValidationInfo) -> LimitsSettings:
    """The request limits of the API validating (its settings in the context), else the defaults."""
    context = info.context or {}
    api = context.get("api")
    return api.limits if isinstance(api, ApiSettings) else LimitsSettings()


def _as_list(value: Any) -> Any:
    """A single value is accepted where a list is expected."""
    return None if value is None else value if isinstance(value, list) else [value]


def check_text(value: str) -> str:
    """Text that PostgreSQL and OpenSearch can take verbatim: valid UTF-8 (no lone surrogates), no NUL."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


def _bounded_list(value: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
    if value is None:
        return None
    if not value:
        raise ValueError("must not be an empty list (omit the filter instead)")
    limit = _limits(info).max_filter_values
    if len(value) > limit:
        raise ValueError(f"at most {limit} values allowed, got {len(value)}")
    for v in value:
        if isinstance(v, str):
            if not v.strip():
                raise ValueError("values must not be blank")
            check_text(v)
    return list(dict.fromkeys(value))


class SearchFilters(BaseModel):
    """Metadata filters; each list matches any of its values, lists are AND-ed together."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project_id: list[Id] | None = Field(None, description="also narrows the compiled access scope")
    matter_id: list[Id] | None = None
    doc_type: list[Id] | None = Field(None, description="ontology node ids; matches the node's whole subtree")
    version_status: list[VersionStatus] | None = None
    language: list[Annotated[str, Field(max_length=64)]] | None = None
    date_from: dt.date | None = Field(None, description="inclusive lower bound on doc_date")
    date_to: dt.date | None = Field(None, description="inclusive upper bound on doc_date")
    clause_type: list[Id] | None = Field(None, description="ontology node ids; only clause rows carry one")
    chunk_kind: list[ChunkKind] | None = None

    @field_validator(
        "project_id",
        "matter_id",
        "doc_type",
        "version_status",
        "language",
        "clause_type",
        "chunk_kind",
        mode="before",
    )
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("project_id", "matter_id", "doc_type", "version_status", "language", "clause_type", "chunk_kind")
    @classmethod
    def _bounded(cls, value: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
        return _bounded_list(value, info)

    @model_validator(mode="after")
    def _date_range(self) -> SearchFilters:
        if self.date_from and self.date_to and self.date_from > self.date_to:
            raise ValueError("date_from must not be after date_to")
        return self


class _Window(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: int = Field(10, ge=1)
    offset: int = Field(0, ge=0, le=MAX_ID)

    @field_validator("limit")
    @classmethod
    def _limit(cls, value: int, info: ValidationInfo) -> int:
        limit = _limits(info).max_limit
        if value > limit:
            raise ValueError(f"must be at most {limit}")
        return value

    @property
    def window(self) -> int:
        return self.offset + self.limit


class _Paged(_Window):
    filters: SearchFilters = Field(default_factory=lambda: SearchFilters())
    explain: bool = False
    consistency_token: str | None = Field(
        None,
        pattern=r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
        description="an LSN the writer read after its commit (`SELECT pg_current_wal_lsn()`): the answer waits "
        "until the index has applied every change committed up to it (at most api.consistency.max_wait_s, else "
        "a 412 `stale`) and says so in `consistency`",
    )


def _check_query(value: str, info: ValidationInfo, blank_hint: str) -> str:
    if not value.strip():
        raise ValueError(f"must not be blank{blank_hint}")
    limit = _limits(info).max_query_chars
    if len(value) > limit:
        raise ValueError(f"at most {limit} characters allowed, got {len(value)}")
    # The same normalisation as every indexed text (NFC, soft hyphens, space variants...).
    return normalise_text(check_text(value))


class SearchRequest(_Paged):
    """`POST /v1/search`: ranked hybrid search."""

    query: str = Field(..., description="query text; a pasted identifier is matched by the identifier leg")
    mode: Literal["hybrid", "lexical", "semantic"] | None = Field(
        None,
        description="legs to run: hybrid (lexical + semantic + identifier), lexical (lexical + identifier) or "
        "semantic only; default: what the evaluation reports support (see the response's `mode`)",
    )

    expand: bool = Field(
        False,
        description="add each hit's neighbouring body chunks (ordinal ± 1, same version) as `context`; per document "
        "at most retrieval.neighbours_max_chunks_per_document chunks in all",
    )
    as_of: dt.date | None = Field(
        None,
        description="point in time: per document only the latest final or executed version dated on or before "
        "this day is searched (also for the document a query names)",
    )
    evidence_budget_chars: int | None = Field(
        None,
        ge=1,
        le=MAX_EVIDENCE_BUDGET,
        description="total characters of hit text (and `context`) in the answer: hits in rank order while they "
        "fit, the first hit cut to it if longer; `evidence` in the answer tells what was used and where the "
        "next page starts; default retrieval.evidence_budget_chars (none)",
    )

    @field_validator("query")
    @classmethod
    def _query(cls, value: str, info: ValidationInfo) -> str:
        return _check_query(value, info, " (use /v1/search/filter for metadata-only search)")


class FilterRequest(_Paged):
    """`POST /v1/search/filter`: metadata-only search (no query text, no ranking)."""


class DecisionFilters(BaseModel):
    """Narrowing for decision search; each list matches any of its values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project_id: list[Id] | None = None
    document_id: list[Id] | None = None

    @field_validator("project_id", "document_id", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("project_id", "document_id")
    @classmethod
    def _bounded(cls, value: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
        return _bounded_list(value, info)


class DecisionSearchRequest(_Window):
    """`POST /v1/decisions/search`: decision records by token overlap with locus, change summary and rationale."""

    query: str = Field(..., description="query text; its words are matched against the decision records")
    filters: DecisionFilters = Field(default_factory=lambda: DecisionFilters())

    @field_validator("query")
    @classmethod
    def _query(cls, value: str, info: ValidationInfo) -> str:
        return _check_query(value, info, "")


RelationKind = Literal["supersedes", "annex_of", "responds_to", "references", "thread"]  # ki.db.models


class _Relations(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kinds: list[RelationKind] | None = Field(None, description="edge types to follow (default: all)")
    direction: Literal["outgoing", "incoming", "both"] = Field(
        "both", description="outgoing: from the document to others; incoming: from others to it"
    )

    @field_validator("kinds", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("kinds")
    @classmethod
    def _bounded(cls, value: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
        return _bounded_list(value, info)


class RelatedRequest(_Relations):
    """`GET /v1/documents/{id}/related?kinds=references,annex_of&direction=both&limit=50`."""

    limit: int = Field(50, ge=1, description="at most this many edges (api.limits.max_related)")

    @field_validator("limit")
    @classmethod
    def _limit(cls, value: int, info: ValidationInfo) -> int:
        limit = _limits(info).max_related
        if value > limit:
            raise ValueError(f"must be at most {limit}")
        return value


class ReadRequest(BaseModel):
    """`GET /v1/documents/{id}/versions/{version_id}/text?offset=0&length=2000`: a slice of a version's text
    (characters of its NFC form)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    offset: int = Field(0, ge=0, le=2_000_000_000, description="the first character read (0: the start)")
    length: int | None = Field(
        None, ge=1, description="characters to read (default and maximum api.limits.max_read_chars)"
    )

    @field_validator("length")
    @classmethod
    def _length(cls, value: int | None, info: ValidationInfo) -> int | None:
        limit = _limits(info).max_read_chars
        if value is not None and value > limit:
            raise ValueError(f"must be at most {limit}")
        return value

    def characters(self, api: ApiSettings) -> int:
        return self.length or api.limits.max_read_chars


class LookupRequest(BaseModel):
    """`POST /v1/lookup`: exactly one document (and version) by an identifier or an exact title -- never a
    ranking (search.documents.lookup). Give `identifier` or `title`, not both."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    identifier: str | None = Field(
        None,
        description="a court file number (`29 O 167/21`, `VIII ZR 123/20`), an ECLI, a statute provision "
        "(`§ 535 BGB`, `Art. 3 GG`) or any other identifier a document carries (a contract number); spacing, "
        "case, `§`/`Art.`/`Abs.` and Unicode forms do not matter",
    )
    title: str | None = Field(None, description="a document's exact title (spacing, case and punctuation aside)")
    as_of: dt.date | None = Field(
        None,
        description="the version in force that day: the latest final or executed version dated on or before it "
        "(default: the version the document is cited by, its latest final one)",
    )
    project_id: list[Id] | None = Field(None, description="only documents of these projects")

    @field_validator("identifier", "title")
    @classmethod
    def _name(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _check_query(value, info, "")

    @field_validator("project_id", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("project_id")
    @classmethod
    def _bounded(cls, value: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
        return _bounded_list(value, info)


class TraverseRequest(_Relations):
    """`POST /v1/traverse`: the documents reachable from `start` over relations, every one access-checked."""

    start: list[Id] = Field(..., description="document ids to start from")
    direction: Literal["outgoing", "incoming", "both"] = "outgoing"
    depth: int = Field(1, ge=1, description="edges deep (at most api.limits.max_traverse_depth)")
    max_fanout: int | None = Field(
        None,
        ge=1,
        description="edges followed out of one document (default and maximum api.limits.max_traverse_fanout)",
    )

    @field_validator("start", mode="before")
    @classmethod
    def _listify_start(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("start")
    @classmethod
    def _bounded_start(cls, value: list[Any], info: ValidationInfo) -> list[Any]:
        return _bounded_list(value, info) or []

    @field_validator("depth")
    @classmethod
    def _depth(cls, value: int, info: ValidationInfo) -> int:
        limit = _limits(info).max_traverse_depth
        if value > limit:
            raise ValueError(f"must be at most {limit} (api.limits.max_traverse_depth)")
        return value

    @field_validator("max_fanout")
    @classmethod
    def _fanout(cls, value: int | None, info: ValidationInfo) -> int | None:
        limit = _limits(info).max_traverse_fanout
        if value is not None and value > limit:
            raise ValueError(f"must be at most {limit} (api.limits.max_traverse_fanout)")
        return value


W = TypeVar("W", bound=_Window)


M = TypeVar("M", bound=BaseModel)


def validate_request(model: type[M], data: Any, api: ApiSettings) -> M:
    """`data` as `model` under the `api` limits; the first error as `RequestInvalid` naming its field."""
    if not isinstance(data, dict):
        raise RequestInvalid("body", "must be a JSON object")
    try:
        return model.model_validate(data, context={"api": api})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"] if not isinstance(p, int)]
        field = ".".join(loc) or "body"
        raise RequestInvalid(field, err["msg"].removeprefix("Value error, ")) from None


def _parse(model: type[W], data: Any, api: ApiSettings) -> W:
    request = validate_request(model, data, api)
    if request.window > MAX_RANKED_WINDOW:
        raise WindowTooDeep(request.offset, request.limit)
    return request


def parse_traverse_request(data: Any, api: ApiSettings) -> TraverseRequest:
    return validate_request(TraverseRequest, data, api)


def parse_related_request(query: Mapping[str, str], api: ApiSettings) -> RelatedRequest:
    """From a query string: `kinds` comma-separated, `direction`, `limit` (a number)."""
    data: dict[str, Any] = {}
    for name, value in query.items():
        if name == "kinds":
            data[name] = [k.strip() for k in value.split(",") if k.strip()]
        elif name == "limit":
            try:
                data[name] = int(value)
            except ValueError:
                raise RequestInvalid("limit", f"must be a whole number, got {value[:40]!r}") from None
        else:
            data[name] = value
    return validate_request(RelatedRequest, data, api)


def parse_read_request(query: Mapping[str, str], api: ApiSettings) -> ReadRequest:
    """From a query string: `offset` and `length`, whole numbers."""
    data: dict[str, Any] = {}
    for name, value in query.items():
        if name in ("offset", "length"):
            if not value.isascii() or not value.isdigit() or len(value) > 12:
                raise RequestInvalid(name, f"must be a whole number, got {value[:40]!r}")
            data[name] = int(value)
        else:
            data[name] = value
    return validate_request(ReadRequest, data, api)


def parse_lookup_request(data: Any, api: ApiSettings) -> LookupRequest:
    """A lookup asks by exactly one of `identifier` and `title` (a 400 naming the field otherwise)."""
    request = validate_request(LookupRequest, data, api)
    if request.identifier is None and request.title is None:
        raise RequestInvalid("identifier", "give `identifier` or `title`")
    if request.identifier is not None and request.title is not None:
        raise RequestInvalid("title", "give `identifier` or `title`, not both")
    return request


def parse_search_request(data: Any, api: ApiSettings) -> SearchRequest:
    return _parse(SearchRequest, data, api)


def parse_filter_request(data: Any, api: ApiSettings) -> FilterRequest:
    return _parse(FilterRequest, data, api)


def parse_decision_request(data: Any, api: ApiSettings) -> DecisionSearchRequest:
    return _parse(DecisionSearchRequest, data, api)


def point_in_time_clauses(as_of: dt.date | None) -> list[dict[str, Any]]:
    """What every version in force on `as_of` satisfies (which of them is in force is checked in SQL)."""
    if as_of is None:
        return []
    return [
        {"terms": {"version_status": ["final", "executed"]}},
        {"range": {"doc_date": {"lte": as_of.isoformat()}}},
    ]


def metadata_clauses(filters: SearchFilters) -> list[dict[str, Any]]:
    """OpenSearch filter clauses for the metadata filters (ids are indexed as strings)."""
    clauses: list[dict[str, Any]] = []

    def terms(field: str, values: list[Any] | None) -> None:
        if values:
            clauses.append({"terms": {field: [str(v) for v in values]}})

    terms("project_id", filters.project_id)
    terms("matter_id", filters.matter_id)
    terms("doc_type_ancestors", filters.doc_type)  # subtree: every row lists its type's ancestors
    terms("version_status", filters.version_status)
    terms("language", filters.language)
    terms("clause_type", filters.clause_type)
    terms("chunk_kind", filters.chunk_kind)
    if filters.date_from or filters.date_to:
        bounds: dict[str, str] = {}
        if filters.date_from:
            bounds["gte"] = filters.date_from.isoformat()
        if filters.date_to:
            bounds["lte"] = filters.date_to.isoformat()
        clauses.append({"range": {"doc_date": bounds}})
    return clauses
