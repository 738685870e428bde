"""The Faust app is built from the settings of the process that runs it, never at import time."""

import streams.app
from ki.settings import Settings


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
    app = streams.app.create_app(settings)
    assert app.conf.id == "ki-test-app"
    assert app.conf.web_port == 7123
    assert [str(url) for url in app.conf.broker] == ["kafka://127.0.0.1:1", "kafka://127.0.0.1:2"]
    topics = {t for agent in app.agents.values() for t in agent.channel.topics}
    assert topics and all(t.startswith("ki_test.") for t in topics)
