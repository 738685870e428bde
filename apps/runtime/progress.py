"""Progress of long jobs (`ki demo`, `ki eval`, `ki rebuild`, `ki backfill`) as a person reads it.

`RateWindow` is the estimator: rate and ETA from the samples of a recent window (30 s by default), not
from the start, which a slow warm-up, a resumed run or a worker stuck behind one batch would skew for
the rest of the run. It is pure: the caller gives the time.

`ProgressReport` shows one count against its total: a `rich` progress bar when its stream is a terminal,
otherwise plain lines, at most one every `interval_s` seconds, each with count/total, rate and ETA (the
form a log file or CI output can hold). Both forms take rate and ETA from the same `RateWindow`.
`StepReport` is a job of several steps (rebuild reads events, then projects versions): one
`ProgressReport` per step, fed by a `(unit, done, total)` callback that `streams.replay` accepts without
importing anything from `apps`.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Column

Clock = Callable[[], float]


class RateWindow:
    """Units per second over the last `window_s` seconds.

    Samples closer than `min_spacing_s` to the one before replace it (a caller may report every event;
    the window stays small). The newest sample at or before the window's start is kept as its anchor, so
    sparse samples still span the whole window."""

    def __init__(self, window_s: float = 30.0, min_spacing_s: float = 1.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self.min_spacing_s = min_spacing_s
        self.points: deque[tuple[float, int]] = deque()

    def add(self, at: float, done: int) -> None:
        if len(self.points) >= 2 and at - self.points[-2][0] < self.min_spacing_s:
            self.points[-1] = (at, done)
        else:
            self.points.append((at, done))
        while len(self.points) > 2 and at - self.points[1][0] >= self.window_s:
            self.points.popleft()

    def rate(self) -> float | None:
        """None until two samples span some time; 0.0 when nothing moved in the window (stalled)."""
        if len(self.points) < 2:
            return None
        (t0, d0), (t1, d1) = self.points[0], self.points[-1]
        if t1 <= t0:
            return None
        return max(0.0, (d1 - d0) / (t1 - t0))  # a count going down (an index replaced) is no progress

    def span(self) -> float:
        """Seconds the samples in the window cover (less than `window_s` early in a run)."""
        return self.points[-1][0] - self.points[0][0] if len(self.points) >= 2 else 0.0

    def eta(self, done: int, total: int | None) -> float | None:
        """Seconds to `total` at the recent rate; 0 when there; None without a total or when stalled."""
        if total is None:
            return None
        if done >= total:
            return 0.0
        rate = self.rate()
        return (total - done) / rate if rate else None


def duration(seconds: float) -> str:
    """`45s`, `12m05s`, `3h04m`."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def rate_text(window: RateWindow, unit: str, done: int | None = None) -> str:
    """The recent rate; before anything is done "waiting for the first" (nothing could have moved yet, which is
    not a stall), and a stall names the time it was measured over, not more than has passed."""
    rate = window.rate()
    if not rate and done == 0:
        return f"waiting for the first {unit}"
    if rate is None:
        return "rate: measuring"
    if rate == 0:
        return f"stalled (nothing in the last {duration(min(window.window_s, window.span()))})"
    return f"{rate:.1f} {unit}/s"


def eta_text(window: RateWindow, done: int, total: int | None) -> str:
    eta = window.eta(done, total)
    return "" if eta is None else f"ETA {duration(eta)}"


def plain_line(
    label: str, unit: str, done: int, total: int | None, window: RateWindow, elapsed: float, note: str = ""
) -> str:
    """`rebuild: 640/1000 versions (64%), 12.5 versions/s, ETA 29s, 51s elapsed; <note>`."""
    if total is None:
        count = f"{done} {unit}"
    else:
        count = f"{done}/{total} {unit}" + (f" ({done / total:.0%})" if total else "")
    parts = [count, rate_text(window, unit, done), eta_text(window, done, total), f"{duration(elapsed)} elapsed"]
    line = f"{label}: " + ", ".join(p for p in parts if p)
    return f"{line}; {note}" if note else line


class ProgressReport:
    """One count against its total, shown as a bar on a terminal and as throttled plain lines otherwise.

    `update(done)` as often as you like; `close()` (or the `with` block's end) shows the final state.
    `live` forces the form (default: a bar exactly when `stream` is a terminal)."""

    def __init__(
        self,
        label: str,
        unit: str,
        total: int | None = None,
        *,
        stream: TextIO | None = None,
        live: bool | None = None,
        interval_s: float = 5.0,
        window_s: float = 30.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.label, self.unit, self.total = label, unit, total
        self.stream = stream if stream is not None else sys.stderr
        self.console = Console(file=self.stream)
        self.live = self.console.is_terminal if live is None else live
        self.interval_s = interval_s
        self.window = RateWindow(window_s)
        self.clock = clock
        self.started = clock()
        self.done = 0
        self.note = ""
        self._last_line: float | None = None  # when the last plain line was written
        self._shown = True  # the plain lines show the current state
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def update(self, done: int, total: int | None = None, note: str | None = None) -> None:
        now = self.clock()
        self.done = done
        if total is not None:
            self.total = total
        if note is not None:
            self.note = note
        self.window.add(now, done)
        self._shown = False
        if self.live:
            self._draw()
        elif self._last_line is None or now - self._last_line >= self.interval_s:
            self._write_line(now)

    def message(self, line: str) -> None:
        """A line of its own (above the bar on a terminal; after the current state in plain lines)."""
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
            return
        if not self.live and not self._shown:
            self._write_line(self.clock())
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._draw()
            self._bar.stop()
            self._bar = None
        elif not self.live and not self._shown:
            self._write_line(self.clock())

    def __enter__(self) -> ProgressReport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_line(self, now: float) -> None:
        line = plain_line(self.label, self.unit, self.done, self.total, self.window, now - self.started, self.note)
        print(line, file=self.stream, flush=True)
        self._last_line = now
        self._shown = True

    def _draw(self) -> None:
        figures = [
            f"{self.done}/{self.total} {self.unit}" if self.total is not None else f"{self.done} {self.unit}",
            rate_text(self.window, self.unit, self.done),
            eta_text(self.window, self.done, self.total),
        ]
        status = ", ".join(f for f in figures if f) + (f"; {self.note}" if self.note else "")
        if self._bar is None:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(bar_width=20),
                # One column for the figures, wrapped (not cut) on a narrow terminal.
                TextColumn("{task.fields[status]}", table_column=Column(no_wrap=False, overflow="fold")),
                console=self.console,
                refresh_per_second=4,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.done, status=status)
        else:
            assert self._task is not None
            self._bar.update(self._task, total=self.total, completed=self.done, status=status)


class StepReport:
    """A job of several steps, each a count of its own unit: `advance(unit, done, total)` closes the
    previous step's report when the unit changes. `line(text)` writes a message (above a bar)."""

    def __init__(
        self, label: str, *, stream: TextIO | None = None, live: bool | None = None, clock: Clock = time.monotonic
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.live = live
        self.clock = clock
        self.current: ProgressReport | None = None

    def advance(self, unit: str, done: int, total: int) -> None:
        if self.current is None or self.current.unit != unit:
            self.close()
            self.current = ProgressReport(self.label, unit, total, stream=self.stream, live=self.live, clock=self.clock)
        self.current.update(done, total)

    def line(self, text: str) -> None:
        if self.current is not None:
            self.current.message(text)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None

    def __enter__(self) -> StepReport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
