"""The Faust app is built from the settings of the process that runs it, never at import time."""

import streams.app
from ki.db.models import CAPTURED_TABLES
from ki.settings import Settings
from projections.dirty import CONTENT_TABLES
from streams.checkpoint import COMMIT_EVERY, COMMIT_INTERVAL_S


def test_importing_the_module_builds_no_app():
    assert not hasattr(streams.app, "app")


def test_the_app_uses_the_given_settings(tmp_path):
    settings = Settings.model_validate(
        {
            "streams": {"app_id": "ki-test-app", "web_port": 7123, "dlq_topic": "ki_test.dlq"},
            "kafka": {"bootstrap_servers": "127.0.0.1:1,127.0.0.1:2", "topic_prefix": "ki_test"},
            "stack": {"home": str(tmp_path)},
        }
    )
    content = streams.app.create_app(settings, "content")
    assert content.conf.id == "ki-test-app"
    assert content.conf.web_port == 7123
    assert [str(url) for url in content.conf.broker] == ["kafka://127.0.0.1:1", "kafka://127.0.0.1:2"]
    access = streams.app.create_app(settings, "access")
    assert access.conf.id == "ki-test-app-access"
    assert access.conf.web_port == 7124  # web_port + 1 unless streams.access_web_port says otherwise
    for app in (content, access):  # Faust commits what the checkpoint released, on its cadence
        assert (app.conf.broker_commit_every, app.conf.broker_commit_interval) == (COMMIT_EVERY, COMMIT_INTERVAL_S)
        assert app.conf.stream_wait_empty is False


def topics_of(app):
    return {t.rsplit(".", 1)[1] for agent in app.agents.values() for t in agent.channel.topics}


def test_the_content_lane_reads_the_content_tables_and_the_access_lane_reads_every_table(tmp_path):
    settings = Settings.model_validate({"kafka": {"topic_prefix": "ki_test"}, "stack": {"home": str(tmp_path)}})
    content = topics_of(streams.app.create_app(settings, "content"))
    access = topics_of(streams.app.create_app(settings, "access"))
    assert content == set(CONTENT_TABLES)
    assert access == {*CAPTURED_TABLES, "message"}  # and the truncate markers (`ki_test.message`)
    # Grants, memberships, aliases and observations never wait behind embedding.
    assert {"grants", "group_memberships", "principal_aliases", "source_observations"}.isdisjoint(content)
