"""The local stack's settings live with the stack's tools (apps.dev.stack.settings); the runtime's Settings carries
the `stack` section unread, so a runtime process never validates, nor depends on, dev tooling's fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.dev.stack.keycloak import Keycloak
from apps.dev.stack.opensearch import OpenSearch
from apps.dev.stack.paths import StackPaths
from apps.dev.stack.settings import StackSettings, stack_settings
from ki.errors import SettingsError
from ki.settings import LOCAL_STACK_HOME, Settings, load_settings


def test_defaults_without_a_stack_section() -> None:
    stack = stack_settings(Settings())
    assert stack == StackSettings() and stack.home == LOCAL_STACK_HOME and not stack.secure


def test_environment_variables_arrive_typed(tmp_path: Path) -> None:
    environ = {"KI_STACK__HOME": str(tmp_path), "KI_STACK__SECURE": "true", "KI_STACK__KEYCLOAK_PORT": "58190"}
    stack = stack_settings(load_settings(environ=environ))
    assert (stack.home, stack.secure, stack.keycloak_port) == (str(tmp_path), True, 58190)


def test_a_numeric_home_stays_a_path() -> None:
    assert stack_settings(load_settings(environ={"KI_STACK__HOME": "2026"})).home == "2026"


def test_the_config_file_section_is_read(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"stack": {"opensearch_heap": "2g", "cluster": True}}))
    stack = stack_settings(load_settings(config, environ={}))
    assert stack.opensearch_heap == "2g" and stack.cluster


@pytest.mark.parametrize(
    ("environ", "named"),
    [({"KI_STACK__KEYCLOAK_PORT": "0"}, "stack.keycloak_port"), ({"KI_STACK__HOMEDIR": "/x"}, "stack.homedir")],
)
def test_a_wrong_stack_setting_is_one_readable_line(environ: dict[str, str], named: str) -> None:
    settings = load_settings(environ=environ)  # the runtime does not read the section: it loads
    with pytest.raises(SettingsError) as caught:
        stack_settings(settings)
    assert str(caught.value).startswith(f"config error: {named}: ")


def test_the_runtime_section_declares_no_stack_field() -> None:
    assert Settings.model_fields["stack"].annotation.model_fields == {}


def test_keycloak_gets_its_own_start_deadline_and_the_others_the_stacks(tmp_path: Path) -> None:
    environ = {"KI_STACK__HOME": str(tmp_path), "KI_STACK__KEYCLOAK_START_TIMEOUT_S": "900"}
    settings = load_settings(environ=environ)
    paths = StackPaths(tmp_path)
    stack_default = stack_settings(settings).start_timeout_s
    assert Keycloak(settings, paths).start_timeout_s(stack_default) == 900.0
    assert OpenSearch(settings, paths).start_timeout_s(stack_default) == stack_default == 180.0
