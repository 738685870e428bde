"""Published baselines, the printed table, the JSON record and the bar chart of `ki eval`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from apps.dev.eval.metrics import METRICS, ndcg_at_k
from apps.dev.plotting import pyplot, save_figure

_NUMBER = re.compile(r"^\d+(\.\d+)?$")


@dataclass(frozen=True)
class Baseline:
    system: str
    ndcg10: float
    recall100: float | None
    source: str
    mrr10: float | None = None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_baselines(readme: str) -> list[Baseline]:
    """Rows of the first markdown table whose header reads `system | nDCG@10 | recall@100 | [MRR@10 |] source`.

    A dash (or anything not a number) in the recall column means "not published" (None); bold
    figures (`**0.49**`) are read as numbers."""
    lines = readme.splitlines()
    out: list[Baseline] = []
    for i, line in enumerate(lines):
        header = [c.lower() for c in _cells(line)] if line.strip().startswith("|") else []
        if header[:3] != ["system", "ndcg@10", "recall@100"] or "source" not in header:
            continue
        source_at = header.index("source")
        mrr_at = header.index("mrr@10") if "mrr@10" in header else None
        for row in lines[i + 2 :]:  # skip the |---| line
            if not row.strip().startswith("|"):
                break
            cells = [c.strip("*") for c in _cells(row)]
            if len(cells) <= source_at or not _NUMBER.match(cells[1]):
                continue
            recall = float(cells[2]) if _NUMBER.match(cells[2]) else None
            mrr = float(cells[mrr_at]) if mrr_at is not None and _NUMBER.match(cells[mrr_at]) else None
            out.append(Baseline(cells[0], float(cells[1]), recall, cells[source_at], mrr))
        break
    return out


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def format_table(results: Mapping[str, Mapping[str, float]], baselines: Sequence[Baseline], *, title: str) -> str:
    """Our rows (one per mode, in the given order) above the reference figures of the data set README."""
    rows: list[tuple[str, str, str, str]] = [("system", "nDCG@10", "recall@100", "MRR@10")]
    for mode, metrics in results.items():
        rows.append(
            (f"ki {mode}", _fmt(metrics.get("ndcg@10")), _fmt(metrics.get("recall@100")), _fmt(metrics.get("mrr@10")))
        )
    if baselines:
        rows.append(("reference (data set README)", "", "", ""))
        rows += [(f"  {b.system}", _fmt(b.ndcg10), _fmt(b.recall100), _fmt(b.mrr10)) for b in baselines]
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    lines = [title]
    for n, row in enumerate(rows):
        cells = (cell.ljust(widths[c]) if c == 0 else cell.rjust(widths[c]) for c, cell in enumerate(row))
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(results: Mapping[str, Mapping[str, float]], baselines: Sequence[Baseline]) -> str:
    """The same figures as a markdown table (for BENCHMARKS.md)."""
    lines = ["| system | nDCG@10 | recall@100 | MRR@10 |", "| --- | ---: | ---: | ---: |"]
    for mode, m in results.items():
        figures = " | ".join(_fmt(m.get(name)) for name in METRICS)
        lines.append(f"| **ki {mode}** | {figures} |")
    for b in baselines:
        lines.append(f"| {b.system} (README) | {_fmt(b.ndcg10)} | {_fmt(b.recall100)} | {_fmt(b.mrr10)} |")
    return "\n".join(lines)


def first_relevant_rank(ranked: Sequence[str], judgments: Mapping[str, int]) -> int | None:
    """1-based rank of the first relevant document in `ranked` (None: not retrieved)."""
    for rank, doc in enumerate(dict.fromkeys(ranked), start=1):
        if judgments.get(doc, 0) > 0:
            return rank
    return None


def query_diff(
    lexical: Mapping[str, Sequence[str]],
    hybrid: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    queries: Mapping[str, str],
) -> list[dict[str, Any]]:
    """The test queries where hybrid's nDCG@10 is below lexical's, biggest loss first (then query id):
    id, text, both nDCG@10 and the rank of the first relevant document in each mode."""
    out: list[dict[str, Any]] = []
    for qid, judgments in qrels.items():
        lex = ndcg_at_k(lexical.get(qid, ()), judgments, 10)
        hyb = ndcg_at_k(hybrid.get(qid, ()), judgments, 10)
        if hyb < lex:
            out.append(
                {
                    "query_id": qid,
                    "text": queries.get(qid, ""),
                    "ndcg@10_lexical": round(lex, 6),
                    "ndcg@10_hybrid": round(hyb, 6),
                    "loss": round(lex - hyb, 6),
                    "rank_lexical": first_relevant_rank(lexical.get(qid, ()), judgments),
                    "rank_hybrid": first_relevant_rank(hybrid.get(qid, ()), judgments),
                    "relevant": sorted(doc for doc, gain in judgments.items() if gain > 0),
                }
            )
    out.sort(key=lambda row: (-row["loss"], row["query_id"]))
    return out


def write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    tmp.replace(path)


def write_json(path: Path, record: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False, default=jsonable) + "\n", encoding="utf-8")
    tmp.replace(path)


def jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_plot(
    path: Path, results: Mapping[str, Mapping[str, float]], baselines: Sequence[Baseline], *, title: str
) -> None:
    """Left: nDCG@10 of every mode next to the published systems (grey), best on top.
    Right: recall@100 and MRR@10 per mode."""
    plt = pyplot()
    assert plt is not None, "callers check that matplotlib is installed"

    modes = list(results)
    colours = {mode: f"C{n}" for n, mode in enumerate(modes)}
    rows = [(f"ki {m}", results[m].get("ndcg@10", 0.0), colours[m]) for m in modes]
    rows += [(b.system, b.ndcg10, "0.7") for b in baselines]
    rows.sort(key=lambda r: r[1])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.9 + 0.42 * len(rows)), dpi=110,
                                      gridspec_kw={"width_ratios": [3, 2]})  # fmt: skip
    bars = left.barh([r[0] for r in rows], [r[1] for r in rows], color=[r[2] for r in rows])
    left.bar_label(bars, labels=[f"{r[1]:.3f}" for r in rows], fontsize=8, padding=2)
    left.set_xlim(0, 1.0)
    left.set_xlabel("nDCG@10 (grey: reference figures from the data set README)")
    left.tick_params(axis="y", labelsize=8)

    others = [m for m in METRICS if m != "ndcg@10"]
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        xs = [n + (i - (len(modes) - 1) / 2) * width for n in range(len(others))]
        values = [results[mode].get(metric, 0.0) for metric in others]
        group = right.bar(xs, values, width * 0.95, label=f"ki {mode}", color=colours[mode])
        right.bar_label(group, labels=[f"{v:.3f}" for v in values], fontsize=7, padding=2)
    right.set_xticks(range(len(others)), [m.replace("mrr", "MRR") for m in others])
    right.set_ylim(0, 1.1)
    right.legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path, dpi=100)
