"""How steadily `ki demo` shows indexing progress: the figure behind issue 13's "demo progress advancing at
least every 5 s".

Runs `ki demo` as a child (plain progress lines, as in a log), samples the index's row count every 0.5 s
while the demo waits for its sync, and stops the demo once it has printed `synced`. Reports the longest
time the row count stood still, the longest gap between two progress lines that showed a higher count,
and the lines themselves; writes `benchmarks/demo-progress.json`.

Start from an empty stack to measure the first indexing (`ki stack wipe`), e.g.
`.venv/bin/ki stack down; .venv/bin/ki stack wipe && .venv/bin/python scripts/demo_progress.py`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from apps.dev.checkout import REPO_ROOT
from ki.clients import make_sync_client
from ki.settings import load_settings

_COUNT = re.compile(r"indexing: (\d+)/(\d+)")


def longest_stall(samples: list[tuple[float, int]]) -> float:
    """The longest time between a sample and the next one with a higher count (after the first rise)."""
    rises = [t for (t, n), (_, before) in zip(samples[1:], samples, strict=False) if n > before]
    return max((b - a for a, b in zip(rises, rises[1:], strict=False)), default=0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=200, help="demo versions (the demo's default, 200)")
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "demo-progress.json"))
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args()
    settings = load_settings()
    search = make_sync_client(settings, timeout_s=10)
    alias = settings.retrieval.index_name

    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    samples: list[tuple[float, int]] = []
    synced = threading.Event()
    demo = subprocess.Popen(
        [sys.executable, "-m", "apps.cli", "demo", "--scale", str(args.scale)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )

    def read_output() -> None:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append((time.monotonic() - started, line.rstrip()))
            print(line, end="", flush=True)
            if "ki demo: synced" in line:
                synced.set()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        while not synced.is_set() and demo.poll() is None and time.monotonic() - started < args.timeout:
            try:
                count = int(search.count(index=alias)["count"]) if search.indices.exists_alias(name=alias) else 0
            except Exception:  # noqa: BLE001 - the stack may still be starting: a missing sample is no result
                count = -1
            if count >= 0:
                samples.append((time.monotonic() - started, count))
            time.sleep(0.5)  # sampling interval
    finally:
        demo.terminate()
        demo.wait(60)
    if not synced.is_set():
        print("demo_progress: the demo did not report `synced`", file=sys.stderr)
        return 1

    shown = [(t, int(m.group(1))) for t, line in lines if (m := _COUNT.search(line))]
    report = {
        "command": f"ki demo --scale {args.scale}",
        "seconds_to_synced": next(t for t, line in lines if "ki demo: synced" in line),
        "index_rows_at_end": samples[-1][1] if samples else 0,
        "longest_stall_of_index_rows_s": round(longest_stall(samples), 2),
        "longest_gap_between_advancing_progress_lines_s": round(longest_stall(shown), 2),
        "progress_lines": [{"t": round(t, 1), "line": line} for t, line in lines if _COUNT.search(line)],
        "samples": [{"t": round(t, 1), "rows": n} for t, n in samples],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"demo_progress: synced after {report['seconds_to_synced']:.0f}s; index rows stood still at most "
        f"{report['longest_stall_of_index_rows_s']}s; progress lines advanced at least every "
        f"{report['longest_gap_between_advancing_progress_lines_s']}s; JSON: {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
