"""deploy/systemd/: `systemd-analyze verify` on every unit where systemd is installed (with the `ki` path pointed at a
stand-in: verify insists the binary exists), and on every machine our own parse of the units -- restart policy,
hardening, the shared env file, every secret a credential named by a `*_FILE` setting, commands `ki` accepts."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from apps.dev.checkout import REPO_ROOT
from projections.lanes import LANES
from tests.unit.deploy.helpers import assert_ki_command, setting_exists

SYSTEMD = REPO_ROOT / "deploy" / "systemd"
KI = "/opt/ki-sidecar/bin/ki"
#: Each unit as systemd would load it (the template with each lane as its instance).
UNITS = {**{f"ki-sync@{lane}.service": "ki-sync@.service" for lane in LANES},
         "ki-api.service": "ki-api.service", "ki-mcp.service": "ki-mcp.service"}  # fmt: skip
HARDENING = {
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
    "PrivateDevices": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes", "RestrictSUIDSGID": "yes", "CapabilityBoundingSet": "",
}  # fmt: skip


def _parse(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of (key, value) pairs in order: systemd's syntax without continuation lines (we use none)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        assert not stripped.endswith("\\"), f"line {number}: no continuation lines"
        if stripped.startswith("[") and stripped.endswith("]"):
            current = sections.setdefault(stripped[1:-1], [])
            continue
        assert current is not None and "=" in stripped, f"line {number}: {line!r}"
        key, _, value = stripped.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def _unit(instance: str) -> tuple[dict[str, list[tuple[str, str]]], str]:
    """The parsed unit and its instance (the lane; empty for plain units), with %i expanded."""
    text = (SYSTEMD / UNITS[instance]).read_text()
    name = instance.removesuffix(".service")
    lane = name.split("@", 1)[1] if "@" in name else ""
    return _parse(text.replace("%i", lane)), lane


def _values(section: list[tuple[str, str]], key: str) -> list[str]:
    return [value for k, value in section if k == key]


def test_every_unit_is_in_the_folder_and_every_file_is_a_unit_or_its_companion() -> None:
    files = {path.name for path in SYSTEMD.iterdir()}
    assert files == set(UNITS.values()) | {"ki-sidecar.sysusers.conf", "ki.env.example"}


@pytest.mark.parametrize("instance", sorted(UNITS))
def test_the_unit_restarts_on_failure_hardened_as_its_own_user(instance: str) -> None:
    unit, _ = _unit(instance)
    service = unit["Service"]
    assert _values(service, "Restart") == ["on-failure"]
    for key, value in HARDENING.items():
        assert _values(service, key) == [value], key
    assert _values(service, "User") == ["ki-sidecar"] == _values(service, "Group")
    sysusers = (SYSTEMD / "ki-sidecar.sysusers.conf").read_text()
    assert "u ki-sidecar - " in sysusers
    writable = " ".join(_values(service, "ReadWritePaths")).split()
    assert writable == ["/var/lib/ki-sidecar", "/var/cache/ki-sidecar"]
    environment = dict(value.split("=", 1) for value in _values(service, "Environment"))
    assert environment["KI_STACK__HOME"] == "/var/lib/ki-sidecar"
    if instance.startswith("ki-sync@"):  # the lanes' Faust directory is named for what it is
        assert environment["KI_STREAMS__DATA_DIR"] == "/var/lib/ki-sidecar"
    assert environment["KI_EMBEDDING__MODEL_CACHE_DIR"].startswith("/var/cache/ki-sidecar/")
    assert _values(unit["Install"], "WantedBy") == ["multi-user.target"]


@pytest.mark.parametrize("instance", sorted(UNITS))
def test_settings_come_from_the_env_file_and_every_secret_from_a_credential(instance: str) -> None:
    unit, _ = _unit(instance)
    service = unit["Service"]
    assert _values(service, "EnvironmentFile") == ["/etc/ki-sidecar/ki.env"]
    credentials = {}
    for value in _values(service, "LoadCredential"):
        name, _, path = value.partition(":")
        assert path.startswith("/etc/ki-sidecar/credentials/"), value
        credentials[name] = path
    environment = dict(value.split("=", 1) for value in _values(service, "Environment"))
    for key, value in environment.items():
        assert setting_exists(key), key
        if "PASSWORD" in key or "SECRET" in key or "TOKEN" in key:
            assert key.endswith("_FILE") and value.startswith("%d/"), f"{key}: secrets come as credentials"
            assert value.removeprefix("%d/") in credentials, key
    assert {value.removeprefix("%d/") for value in environment.values() if value.startswith("%d/")} == set(credentials)
    role = "worker" if instance.startswith("ki-sync@") else "api"
    login = f"ki_{role}"
    assert environment["KI_DATABASE__USER"] == environment["KI_KAFKA__SASL_USERNAME"] == login
    for name in ("database-password", "kafka-password", "opensearch-password"):
        assert credentials[name].endswith(f"-{role}"), "each role reads only its own logins"
    shared = {}
    for line in (SYSTEMD / "ki.env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            shared[key] = value
            assert key == "KI_CONFIG" or setting_exists(key), key
            assert not any(word in key for word in ("PASSWORD", "SECRET", "TOKEN")), f"{key}: a secret in ki.env"


@pytest.mark.parametrize("instance", sorted(UNITS))
def test_the_unit_runs_a_command_ki_accepts(instance: str) -> None:
    unit, lane = _unit(instance)
    (exec_start,) = _values(unit["Service"], "ExecStart")
    argv = shlex.split(exec_start)
    assert argv[0] == KI
    assert_ki_command(argv[1:], f"deploy/systemd/{instance}")
    expected = {lane: ["sync", "run", "--lane", lane] for lane in LANES}
    if lane:
        assert argv[1:] == expected[lane]
    else:
        assert argv[1] == {"ki-api.service": "serve", "ki-mcp.service": "mcp"}[instance]


def test_systemd_analyze_verifies_every_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze on this machine: the parse tests above checked the units")
    stand_in = tmp_path / "bin" / "ki"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    for source in set(UNITS.values()):
        (units / source).write_text((SYSTEMD / source).read_text().replace(KI, str(stand_in)))
    result = subprocess.run(
        [analyze, "verify", *(str(units / instance) for instance in UNITS)],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )
