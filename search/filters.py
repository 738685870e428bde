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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from ki.settings import ApiSettings

MAX_RANKED_WINDOW = 500

VersionStatus = Literal["draft", "final", "executed", "unknown"]
ChunkKind = Literal["chunk", "profile", "clause"]


class WindowTooDeep(ValueError):
    """`offset + limit` exceeds the ranked window cap."""

    def __init__(self, offset: int, limit: int) -> None:
        self.offset, self.limit = offset, limit
        super().__init__(f"offset + limit = {offset + limit} exceeds the maximum ranked window of {MAX_RANKED_WINDOW}")


class RequestInvalid(ValueError):
    """A request failed validation; `field` names the offending field (dotted path)."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def _api(info: ValidationInfo) -> ApiSettings:
    context = info.context or {}
    api = context.get("api")
    return api if isinstance(api, ApiSettings) else ApiSettings()


def _as_list(value: Any) -> Any:
    """A single value is accepted where a list is expected."""
    return None if value is None else value if isinstance(value, list) else [value]


class SearchFilters(BaseModel):
    """Metadata filters; each list matches any of its values, lists are AND-ed together."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project_id: list[int] | None = Field(None, description="also narrows the compiled access scope")
    matter_id: list[int] | None = None
    doc_type: list[int] | None = Field(None, description="ontology node ids; matches the node's whole subtree")
    version_status: list[VersionStatus] | None = None
    language: list[str] | None = None
    date_from: dt.date | None = Field(None, description="inclusive lower bound on doc_date")
    date_to: dt.date | None = Field(None, description="inclusive upper bound on doc_date")
    clause_type: list[int] | None = Field(None, description="ontology node ids; only clause rows carry one")
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
        if value is None:
            return None
        if not value:
            raise ValueError("must not be an empty list (omit the filter instead)")
        limit = _api(info).max_filter_values
        if len(value) > limit:
            raise ValueError(f"at most {limit} values allowed, got {len(value)}")
        if any(isinstance(v, int) and v < 1 for v in value):
            raise ValueError("ids must be positive integers")
        if any(isinstance(v, str) and not v.strip() for v in value):
            raise ValueError("values must not be blank")
        return list(dict.fromkeys(value))

    @model_validator(mode="after")
    def _date_range(self) -> SearchFilters:
        if self.date_from and self.date_to and self.date_from > self.date_to:
            raise ValueError("date_from must not be after date_to")
        return self


class _Paged(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: int = Field(10, ge=1)
    offset: int = Field(0, ge=0)
    filters: SearchFilters = Field(default_factory=lambda: SearchFilters())
    explain: bool = False

    @field_validator("limit")
    @classmethod
    def _limit(cls, value: int, info: ValidationInfo) -> int:
        limit = _api(info).max_limit
        if value > limit:
            raise ValueError(f"must be at most {limit}")
        return value

    @property
    def window(self) -> int:
        return self.offset + self.limit


class SearchRequest(_Paged):
    """`POST /v1/search`: ranked hybrid search."""

    query: str = Field(..., description="query text; a pasted identifier is matched by the identifier leg")

    @field_validator("query")
    @classmethod
    def _query(cls, value: str, info: ValidationInfo) -> str:
        if not value.strip():
            raise ValueError("must not be blank (use /v1/search/filter for metadata-only search)")
        limit = _api(info).max_query_chars
        if len(value) > limit:
            raise ValueError(f"at most {limit} characters allowed, got {len(value)}")
        return value


class FilterRequest(_Paged):
    """`POST /v1/search/filter`: metadata-only search (no query text, no ranking)."""


def _parse(model: type[_Paged], data: Any, api: ApiSettings) -> Any:
    if not isinstance(data, dict):
        raise RequestInvalid("body", "must be a JSON object")
    try:
        request = model.model_validate(data, context={"api": api})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"] if not isinstance(p, int)]
        field = ".".join(loc) or "body"
        raise RequestInvalid(field, err["msg"].removeprefix("Value error, ")) from None
    if request.window > MAX_RANKED_WINDOW:
        raise WindowTooDeep(request.offset, request.limit)
    return request


def parse_search_request(data: Any, api: ApiSettings) -> SearchRequest:
    return _parse(SearchRequest, data, api)


def parse_filter_request(data: Any, api: ApiSettings) -> FilterRequest:
    return _parse(FilterRequest, data, api)


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
