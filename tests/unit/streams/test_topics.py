"""CDC topics that must be compacted (streams.topics): the ones a broker's auto-creation left deleting records."""

from __future__ import annotations

from streams.topics import not_compacted


def test_only_topics_without_compaction_are_named() -> None:
    policies = {
        "ki.public.grants": "delete",  # auto-created by the broker after the topics were deleted
        "ki.public.documents": "compact",
        "ki.public.document_versions": "compact,delete",  # compacted, and old segments also expire: kept as is
        "ki.message": "delete",
    }
    assert not_compacted(policies) == ["ki.message", "ki.public.grants"]
    assert not_compacted({}) == []
