"""Where the settings come from: `--config`, `$KI_CONFIG`, the working folder's config.json, the machine's
(/etc/ki-sidecar/config.json), else the built-in defaults; a named file that is missing is an error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from apps.cli import main
from ki import settings as settings_module
from ki.settings import CONFIG_SEARCH_PATH, Settings, SettingsError, find_config, load_settings, tuned_config


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder and a machine path that holds no file: no config anywhere."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(settings_module, "CONFIG_SEARCH_PATH", (Path("config.json"), tmp_path / "etc" / "config.json"))
    return tmp_path


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_the_search_path_is_the_working_folder_then_the_machine() -> None:
    assert list(CONFIG_SEARCH_PATH) == [Path("config.json"), Path("/etc/ki-sidecar/config.json")]


def test_no_file_anywhere_gives_the_tuned_defaults_without_an_error(nowhere: Path) -> None:
    assert find_config(environ={}) is None
    tuned = load_settings(environ={})
    assert tuned == Settings.model_validate(tuned_config())  # the shipped tuning over the spec's class defaults
    assert tuned.retrieval.embedding_dimensions == 384 != Settings().retrieval.embedding_dimensions  # the local model's
    assert tuned.retrieval.text_analyzer == "german_text"
    assert load_settings(environ={"KI_API__PORT": "9191"}).api.port == 9191  # KI_* still apply


def test_the_shipped_tuning_is_the_repositorys_config() -> None:
    from apps.dev.checkout import REPO_ROOT

    assert tuned_config() == json.loads((REPO_ROOT / "config.json").read_text(encoding="utf-8"))


def test_a_file_replaces_the_settings_it_names_and_keeps_the_rest_tuned(nowhere: Path) -> None:
    mine = _write(nowhere / "mine.json", {"database": {"host": "db.internal"}, "retrieval": {"fusion_method": "rrf",
                  "semantic_floor": {"other-model": 0.5}}})  # fmt: skip
    settings = load_settings(mine, environ={})
    assert settings.database.host == "db.internal" and settings.retrieval.fusion_method == "rrf"
    assert settings.retrieval.semantic_floor == {"other-model": 0.5}  # a map setting is replaced whole
    assert (settings.retrieval.embedding_dimensions, settings.retrieval.weight_semantic) == (384, 0.5)  # tuned
    with pytest.raises(SettingsError, match="retrieval.fusion_methd"):  # a typo: named, as validation words it
        load_settings(_write(nowhere / "typo.json", {"retrieval": {"fusion_methd": "rrf"}}), environ={})


def test_ki_config_names_the_file(nowhere: Path) -> None:
    path = _write(nowhere / "mine.json", {"api": {"port": 9292}})
    assert find_config(environ={"KI_CONFIG": str(path)}) == path
    assert load_settings(environ={"KI_CONFIG": str(path)}).api.port == 9292
    # --config (the `path` argument) wins over $KI_CONFIG
    other = _write(nowhere / "other.json", {"api": {"port": 9393}})
    assert load_settings(other, environ={"KI_CONFIG": str(path)}).api.port == 9393


def test_a_named_file_that_is_missing_is_one_line_of_error(nowhere: Path) -> None:
    _write(nowhere / "work" / "config.json", {"api": {"port": 9494}})  # found on the path, but not asked for
    for path, environ in ((nowhere / "absent.json", {}), (None, {"KI_CONFIG": str(nowhere / "absent.json")})):
        with pytest.raises(SettingsError) as raised:
            load_settings(path, environ=environ)
        assert str(raised.value) == f"config error: {nowhere / 'absent.json'}: file not found"
    with pytest.raises(SettingsError, match="a folder, not a file"):
        load_settings(nowhere, environ={})


def test_the_working_folders_file_comes_before_the_machines(nowhere: Path) -> None:
    machine = _write(nowhere / "etc" / "config.json", {"api": {"port": 9595}})
    assert find_config(environ={}) == machine
    assert load_settings(environ={}).api.port == 9595
    local = _write(nowhere / "work" / "config.json", {"api": {"port": 9696}})
    assert find_config(environ={}) == local.absolute()  # absolute: a child started elsewhere reads the same
    assert load_settings(environ={}).api.port == 9696


def test_the_repositorys_config_is_found_from_the_checkouts_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `make demo`, `make test` and CI do: every command runs in the checkout's root."""
    from apps.dev.checkout import REPO_ROOT

    monkeypatch.chdir(REPO_ROOT)
    assert find_config(environ={}) == REPO_ROOT / "config.json"
    assert load_settings(environ={}).retrieval.embedding_dimensions == 384


def test_ki_config_check_names_the_file_or_the_defaults(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in os.environ if n.startswith("KI_")]:
        monkeypatch.delenv(name)
    tuned = [
        f"{section}.{name}" for section, fields in tuned_config().items() for name in fields
    ]  # the shipped tuning, against the spec's class defaults
    assert main(["config", "check"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "config file: none (the built-in defaults)",
        f"config ok: {len(tuned)} setting(s) differ from the defaults: {', '.join(tuned)}",
    ]
    assert main(["--config", str(nowhere / "absent.json"), "config", "check"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"ki: config error: {nowhere / 'absent.json'}: file not found\n"
