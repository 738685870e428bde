"""Which core code does production never run?

Runs the production entry points under coverage against the running local stack (the one the settings
name: `ki stack up` first) and lists every function of the core (`ki/`, `projections/`, `streams/`,
`search/`) that none of them executed. A test of such a function tests code no user ever runs.

The entry points: `ki migrate`, `ki demo` (demo corpus if missing, the sync worker as a child, the search
API) with a set of API requests (every search mode, filters, explain, the filter endpoint, bad input, no
token, the operational endpoints), `ki sync status`, `ki reconcile`, `ki backfill`, `ki rebuild`, `ki token`
`ki serve` and a tiny `ki eval`. Child processes (the worker) are measured too (coverage's subprocess patch).

    .venv/bin/python scripts/production_coverage.py        # ~5-10 min on the demo corpus

Writes build/coverage-production/{report.json,never-run.txt} and prints the never-run functions.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "coverage-production"
CORE = ("ki", "projections", "streams", "search")


def say(line: str) -> None:
    print(f"production-coverage: {line}", file=sys.stderr, flush=True)


def coverage_env() -> dict[str, str]:
    rc = OUT / "coveragerc"
    rc.write_text(
        "[run]\n"
        f"source = {', '.join(CORE)}\n"
        f"data_file = {OUT / '.coverage'}\n"
        "parallel = true\n"
        "patch = subprocess, _exit\n"
        "sigterm = true\n",
        encoding="utf-8",
    )
    return {**os.environ, "COVERAGE_RCFILE": str(rc), "PYTHONUNBUFFERED": "1"}


def ki(env: dict[str, str], *args: str, check: bool = True) -> str:
    say("ki " + " ".join(args))
    done = subprocess.run(
        [sys.executable, "-m", "coverage", "run", "-m", "apps.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if check and done.returncode != 0:
        raise SystemExit(f"production-coverage: ki {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def request(base: str, path: str, token: str | None, body: object | None = None, raw: bytes | None = None) -> int:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(base + path, data=data, method="POST" if data is not None else "GET")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=120) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:  # not listening (yet)
        return 0


def api_requests(base: str, token: str) -> None:
    queries = ["fristlose Kündigung wegen Zahlungsverzug", "§ 535 BGB", "Kaution Mietsache Schäden"]
    for query in queries:
        for mode in ("hybrid", "lexical", "semantic"):
            request(base, "/v1/search", token, {"query": query, "mode": mode, "limit": 5, "explain": True})
    request(base, "/v1/search", token, {"query": queries[0], "limit": 5, "offset": 5})
    request(base, "/v1/search", token, {"query": queries[0], "filters": {"version_status": ["final"]}, "rerank": True})
    request(base, "/v1/search/filter", token, {"filters": {"version_status": ["final"]}, "limit": 3})
    request(base, "/v1/decisions/search", token, {"query": "Kündigung Frist", "limit": 5})
    request(base, "/v1/decisions/search", token, {"query": "Miete", "filters": {"project_id": [1]}})
    request(base, "/v1/search", token, {"query": "", "limit": 1000})  # 400: field errors
    request(base, "/v1/search", token, raw=b"{not json")
    request(base, "/v1/search", None, {"query": queries[0]})  # 401
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        request(base, path, None)


def run_demo(env: dict[str, str]) -> None:
    from ki.settings import load_settings

    settings = load_settings()
    log = OUT / "demo.log"
    say("ki demo (worker child + API), then API requests")
    with log.open("w") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "coverage", "run", "-m", "apps.cli", "demo"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 3600
    while "serving on" not in log.read_text():
        if demo.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"production-coverage: ki demo did not come up; see {log}")
        time.sleep(2)  # polling interval of a deadline loop
    token = log.read_text().split("Authorization: Bearer ", 1)[1].split("'", 1)[0]
    api_requests(f"http://{settings.api.host}:{settings.api.port}", token)
    demo.send_signal(signal.SIGTERM)
    demo.wait(120)


def run_serve(env: dict[str, str]) -> None:
    """`ki serve` itself (the demo runs the API in its own process): up, one probe, SIGTERM."""
    from apps.runtime.processes import Child, free_port

    port = free_port()
    say("ki serve")
    child = Child(
        [sys.executable, "-m", "coverage", "run", "-m", "apps.cli", "serve"],
        OUT / "serve.log",
        env={**env, "KI_API__PORT": str(port)},
        cwd=REPO,
    ).start()
    failure = child.wait_ready(lambda: request(f"http://127.0.0.1:{port}", "/readyz", None) == 200, timeout_s=300)
    if failure:
        raise SystemExit(f"production-coverage: ki serve {failure}; see {OUT / 'serve.log'}")
    child.stop(timeout_s=60)


def never_run(report: dict) -> list[str]:
    """Functions of the core with no executed line (their `def` line aside)."""
    found: list[str] = []
    files = report["files"]
    for package in CORE:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if "/migrations/" in rel:
                continue  # Alembic runs them through its own loader
            executed = set(files.get(rel, {}).get("executed_lines", []))
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    body = {n.lineno for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno")}
                    body -= {node.lineno}
                    if body and not body & executed:
                        found.append(f"{rel}:{node.lineno} {node.name}")
    return found


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for stale in OUT.glob(".coverage*"):
        stale.unlink()
    env = coverage_env()
    ki(env, "migrate")
    ki(env, "token", "--sub", "user:coverage")
    run_demo(env)
    run_serve(env)
    ki(env, "sync", "status", check=False)
    ki(env, "reconcile", check=False)
    ki(env, "backfill")
    ki(env, "rebuild")
    ki(env, "eval", "--data", "tests/data/mietrecht-mini", "--fresh", "--name", "coverage-mini", check=False)
    subprocess.run([sys.executable, "-m", "coverage", "combine", "-q"], cwd=REPO, env=env, check=True)
    subprocess.run(
        [sys.executable, "-m", "coverage", "json", "-q", "-o", str(OUT / "report.json")], cwd=REPO, env=env, check=True
    )
    report = json.loads((OUT / "report.json").read_text())
    found = never_run(report)
    (OUT / "never-run.txt").write_text("\n".join(found) + "\n", encoding="utf-8")
    total = report["totals"]["percent_covered_display"]
    print(f"{len(found)} core functions never run by the production entry points (line coverage {total} %):")
    print("\n".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
