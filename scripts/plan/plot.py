"""shardstream-plan --plot: the pictures a planner looks at.

the epoch line   shards laid end to end in the epoch's order, each rank's span marked,
                 shards that straddle two ranks drawn in red (one source)
per rank         records and bytes to read, integer rank ticks, bytes in KB/MB/GB;
                 for a mixture, each stream's share of the rank's bytes, stacked
passes           for a mixture, where each stream's passes end over the next epochs
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["human_bytes", "plot", "plot_cache"]

MAX_DRAWN_SHARDS = 4000  # beyond this the epoch line shows rank spans and straddles only


def human_bytes(n: float, _pos: Any = None) -> str:
    """1536 -> '1.5 KB' (powers of 1000, as storage bills count)."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'shardstream[plot]'") from None
    return plt


def plot(doc: dict[str, Any], path: str, line: tuple[np.ndarray, int] | None) -> None:
    """Draw `doc` (shardstream-plan's JSON) to a PNG. `line`: (shard ends on the epoch
    line, records per rank) for the epoch line of a single source."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    mixture = "streams" in doc
    rows = doc["per_rank"]
    ranks = np.array([r["rank"] for r in rows])
    has_bytes = any(r["bytes"] for r in rows)
    top = mixture or line is not None
    panels = int(top) + 1 + int(has_bytes)
    fig, axes = plt.subplots(panels, 1, figsize=(12, 3.2 * panels), squeeze=False)
    axes = list(axes[:, 0])
    if mixture:
        _passes(axes.pop(0), doc)
    elif line is not None:
        _epoch_line(axes.pop(0), *line, doc["world_size"])
    panels_per_rank = [("records", "records per rank and epoch", "tab:blue")]
    if has_bytes:
        panels_per_rank.append(("bytes", "bytes to read per rank", "tab:orange"))
    for key, title, color in panels_per_rank:
        ax = axes.pop(0)
        if mixture:
            _stacked(ax, ranks, [r[f"{key}_per_stream"] for r in rows], doc)
            ax.set(title=f"{title}, by stream")
        else:
            ax.bar(ranks, [r[key] for r in rows], color=color)
            ax.set(title=title)
        ax.set(xlabel="rank")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if key == "bytes":
            ax.yaxis.set_major_formatter(FuncFormatter(human_bytes))
        else:
            ax.set(ylabel="records")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _stacked(ax: Any, ranks: np.ndarray, values: list[list[float]], doc: dict[str, Any]) -> None:
    """Bars per rank, each stream's share stacked on the previous ones'."""
    table = np.array(values, dtype=float)  # (ranks, streams)
    bottom = np.zeros(len(ranks))
    for k, stream in enumerate(doc["streams"]):
        ax.bar(ranks, table[:, k], bottom=bottom, label=stream["name"])
        bottom += table[:, k]
    ax.legend(loc="upper right", fontsize="small")


def _epoch_line(ax: Any, ends: np.ndarray, length: int, world: int) -> None:
    """Shards end to end on the epoch line (alternating shades), rank spans marked by
    vertical lines, shards cut between two ranks in red."""
    total = int(ends[-1]) if ends.size else 0
    begins = np.concatenate(([0], ends[:-1]))
    cuts = np.arange(1, world) * length
    cuts = cuts[cuts < total]
    # (S,) whether a rank boundary falls strictly inside each shard
    straddle = np.zeros(ends.size, dtype=bool)
    if cuts.size:
        at = np.searchsorted(ends, cuts, side="right")
        inside = begins[np.minimum(at, ends.size - 1)] < cuts
        straddle[at[inside & (at < ends.size)]] = True
    if ends.size <= MAX_DRAWN_SHARDS:
        spans = list(zip(begins.tolist(), (ends - begins).tolist()))
        colors = ["tab:red" if s else ("0.55" if i % 2 else "0.75") for i, s in enumerate(straddle)]
        ax.broken_barh(spans, (0, 1), facecolors=colors, edgecolors="white", linewidths=0.5)
    else:
        ax.broken_barh([(0, total)], (0, 1), facecolors="0.7")
        for b, e in zip(begins[straddle], ends[straddle]):
            ax.axvspan(b, e, color="tab:red")
    for c in cuts:
        ax.axvline(c, color="black", linewidth=0.8)
    ax.set(
        title=f"epoch line: {ends.size:,} shards end to end, {world} rank spans; "
        f"{int(straddle.sum())} shards straddle two ranks (red)",
        xlabel="record position in the epoch",
        yticks=[],
        xlim=(0, max(total, 1)),
    )


def _passes(ax: Any, doc: dict[str, Any]) -> None:
    """Per stream, the epochs in which its passes end (upsampled streams end often)."""
    for k, s in enumerate(doc["streams"]):
        ends = s["pass_ends"]
        ax.scatter(ends, [k] * len(ends), marker="|", s=300, linewidths=2)
        ax.text(
            doc["epoch"] - 0.4,
            k,
            f"{s['passes_per_epoch']:.2f} passes/epoch",
            va="center",
            ha="right",
            fontsize="small",
        )
    names = [s["name"] for s in doc["streams"]]
    ax.set(
        title="where each stream's passes end (epochs)",
        xlabel="epoch",
        yticks=range(len(names)),
        yticklabels=names,
        ylim=(-0.6, len(names) - 0.4),
    )
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(doc["epoch"] - 4, doc["epoch"] + 20)


def plot_cache(doc: dict[str, Any], path: str) -> None:
    """The node cache simulation: per epoch, bytes the simulated nodes read and what
    next-use eviction and LRU fetch from remote storage (summed over the nodes)."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter

    rows = doc["per_node_epoch"]
    epochs = np.arange(doc["epochs"])
    fig, ax = plt.subplots(figsize=(9, 4))
    bars = [
        ("share", "node reads", "tab:gray"),
        ("next_use", "fetched, next-use", "tab:blue"),
        ("lru", "fetched, LRU", "tab:red"),
    ]
    for k, (key, label, color) in enumerate(bars):
        values = [sum(r[key] for r in rows if r["epoch"] == e) for e in epochs]
        ax.bar(epochs + (k - 1) * 0.27, values, 0.27, label=label, color=color)
    ax.set_xticks(epochs)
    ax.set_xlabel("epoch")
    ax.yaxis.set_major_formatter(FuncFormatter(human_bytes))
    limit = doc["cache_limit"]
    ax.set_title(
        f"{doc['simulated_nodes']} of {doc['nodes']} nodes, cache "
        f"{human_bytes(limit) if limit else 'unbounded'} a node, locality {doc['locality']}"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
