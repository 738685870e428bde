"""`ki sync run`: the sync's lanes (`streams.topics.LANES`), each a process of its own, held together.

Why processes: the content lane spends its time embedding (CPU in onnxruntime and the tokenizer, which
also holds the GIL at times); in one process the access lane's event loop would stall behind it. As
separate processes the operating system schedules them, and the content lane runs at a lower priority
(`streams.content_nice`), so an access change is written within the freshness bound however much text
is queued for embedding.

The supervisor (`apps.runtime.supervisor`) starts one `ki sync run --lane L` per lane; each commits its offsets
and stops on SIGTERM; when one lane exits, the other is stopped and the first non-zero code (3: the index
is incompatible) reaches the operator. The lanes die with the supervisor. A lane that stalls -- records wait
and it neither fetches nor resolves any for `streams.stall_after_s`, or it stops answering -- is killed and
started again (`streams.liveness`).
To scale out, run `ki sync run` on N machines (each lane's partitions are shared among its group's
members), or run the lanes apart with `--lane access` / `--lane content` / `--lane principals` where the
CPU is.
"""

from __future__ import annotations

from apps.runtime.supervisor import Liveness, ki_command, supervise
from ki.settings import Settings
from streams.topics import LANES, Lane, lane_web_port


def lane_command(lane: Lane, *, config: str | None, loglevel: str) -> list[str]:
    return ki_command("sync", "run", "--lane", lane, "--loglevel", loglevel, config=config)


def run_lanes(settings: Settings, *, config: str | None, loglevel: str) -> int:
    """Run every lane as a child (`apps.runtime.supervisor`) until one exits or we are asked to stop; a lane
    that stalls (`streams.liveness`: lag and no progress, or no answer) is restarted."""
    s = settings.streams
    urls: dict[str, str] = {lane: f"http://127.0.0.1:{lane_web_port(settings, lane)}/healthz" for lane in LANES}
    return supervise(
        {lane: lane_command(lane, config=config, loglevel=loglevel) for lane in LANES},
        what="lane",
        liveness=Liveness(urls, s.liveness_interval_s, s.stall_after_s),
    )
