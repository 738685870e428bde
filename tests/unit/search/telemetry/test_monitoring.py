"""The operators' Prometheus scrape config and alert rules (checked by Debian's `promtool`, which
scripts/bootstrap.sh installs) and the Grafana dashboard: every metric they name is one the code exports,
and every scrape target is a port the settings give the API and the lanes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

import streams.metrics  # noqa: F401 - registers the worker's metrics in the default registry
from apps.dev.checkout import REPO_ROOT
from ki.settings import load_settings
from projections.lanes import LANES
from search.telemetry.metrics import SearchMetrics

MONITORING = REPO_ROOT / "monitoring"
_NAME = re.compile(r"\bki_[a-z0-9_]+")


def _exported() -> set[str]:
    names: set[str] = set()
    for registry in (REGISTRY, SearchMetrics().registry):
        for family in registry.collect():
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
    return names


def _expressions() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana/dashboards/ki-sidecar.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    exprs += [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    return exprs


def test_promtool_accepts_the_scrape_config_and_its_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/bootstrap.sh installs Debian's prometheus package"
    # The operator writes the API's scrape token beside the config (never committed); promtool wants it.
    for name in ("prometheus.yml", "alerts.yml"):
        shutil.copy(MONITORING / name, tmp_path / name)
    (tmp_path / "metrics.token").write_text("a-token\n")
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"][0]["rules"]
    assert len(rules) >= 10 and f"SUCCESS: {len(rules)} rules found" in result.stdout + result.stderr


def test_every_metric_the_dashboard_and_the_alerts_name_is_exported() -> None:
    exported = _exported()
    # Histograms are queried through their _bucket series, counters through _total.
    exported |= {f"{n}_bucket" for n in exported} | {f"{n}_total" for n in exported}
    named = {name for expr in _expressions() for name in _NAME.findall(expr)}
    assert named, "no metric found in the dashboard"
    assert named <= exported, f"not exported by the code: {sorted(named - exported)}"
    # The figures of the console's operations dashboard are all on the Grafana board too.
    for figure in ("ki_index_size_bytes", "ki_index_alias_target", "ki_sync_dlq_records", "ki_sync_consumer_lag",
                   "ki_sync_freshness_seconds_bucket", "ki_sync_replication_slot_retained_bytes",
                   "ki_sync_rows_vector_pending"):  # fmt: skip
        assert figure in named, figure


def test_scrape_targets_are_the_configured_ports() -> None:
    settings = load_settings(environ={})
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    targets = {
        job["job_name"]: {t for c in job["static_configs"] for t in c["targets"]} for job in config["scrape_configs"]
    }
    assert targets["ki-search-api"] == {f"{settings.api.host}:{settings.api.port}"}
    lanes = {f"127.0.0.1:{settings.streams.lane_web_port(lane)}" for lane in LANES}
    assert targets["ki-sync"] == lanes
