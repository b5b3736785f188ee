"""The figure: bars of tokens/s, p99 and run-queue delay per condition, with matplotlib when it
is installed, else a plain PNG of the same bars (no text) written by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.figures import GOAL_P99, GOAL_TOK


def plot(
    summary: dict[str, Any],
    path: Path,
    title: str,
    goal_p99: float = GOAL_P99,
    legend: str = "{} noise",
) -> str:
    """matplotlib when installed; otherwise a plain PNG of the same bars, without text.

    ``summary``: series (a bar colour each, named in the legend by ``legend``) -> group (a
    position on the x axis) -> figure -> its spread."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plain_png(summary, path)
        return "plain (matplotlib not installed: bars only, no labels)"
    panels = (
        ("tok_s_x", "tokens/s (x clean)", GOAL_TOK),
        ("p99_x", "p99 token latency (x clean)", goal_p99),
        ("runq_ms_per_token", "run-queue delay (ms/token)", None),
    )
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    noises = list(summary)
    for ax, (key, label, goal) in zip(axes, panels, strict=True):
        conds = list(dict.fromkeys(c for n in noises for c in summary[n]))
        width = 0.8 / max(1, len(noises))
        for i, noise in enumerate(noises):
            xs, ys, lo, hi = [], [], [], []
            for j, c in enumerate(conds):
                if c in summary[noise]:
                    s = summary[noise][c][key]
                    xs.append(j + i * width)
                    ys.append(s["median"])
                    lo.append(s["median"] - s["min"])
                    hi.append(s["max"] - s["median"])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=legend.format(noise))
        ax.set_xticks([j + width * (len(noises) - 1) / 2 for j in range(len(conds))])
        ax.set_xticklabels(conds, rotation=20, ha="right")
        ax.set_title(label)
        if goal is not None:
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.axhline(goal, color="red", ls="--", lw=0.8, label=f"goal {goal}")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "matplotlib"


def plain_png(summary: dict[str, Any], path: Path) -> None:
    import struct
    import zlib

    w, h = 640, 360
    px = [[(255, 255, 255)] * w for _ in range(h)]
    colours = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]

    def rect(x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(h, y1)):
            for x in range(max(0, x0), min(w, x1)):
                px[y][x] = c

    for half, key in enumerate(("tok_s_x", "p99_x")):
        base, top = 170 + half * 180, 10 + half * 180
        scale = (base - top) / 3.0  # 0..3x
        bars = [(n, c) for n in summary for c in summary[n]]
        bw = max(2, (w - 20) // max(1, len(bars)) - 2)
        for k, (noise, cond) in enumerate(bars):
            v = min(3.0, summary[noise][cond][key]["median"])
            x = 10 + k * (bw + 2)
            rect(x, base - int(v * scale), x + bw, base, colours[list(summary).index(noise) % 4])
        rect(0, base - int(scale), w, base - int(scale) + 1, (0, 0, 0))  # 1.0x
    raw = b"".join(b"\0" + bytes(v for p in row for v in p) for row in px)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )
