"""The packing plot for the README (matplotlib, a bench extra: ``pip install -e '.[bench]'``)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any


def packing_plot(packing: dict[str, Any], path: Path) -> Path | None:
    """Pods placed and GPU memory used per way of serving, against the optimum; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    modes = list(packing["modes"].values())
    labels = [textwrap.fill(m["title"], 16) for m in modes]
    figure, (pods_axis, memory_axis) = plt.subplots(1, 2, figsize=(11, 4.6))
    colors = ["#9e9e9e", "#6a8caf", "#d08c3c", "#3c9d5d", "#2f6f8f"][: len(modes)]
    pods_axis.bar(range(len(modes)), [m["pods_placed"] for m in modes], color=colors)
    pods_axis.set_title(f"pods placed (of {packing['trace']['pods']})")
    memory_axis.bar(range(len(modes)), [m["memory_used_gib"] for m in modes], color=colors, label="used by pods")
    memory_axis.bar(range(len(modes)), [m["memory_allocated_gib"] - m["memory_used_gib"] for m in modes],
                    bottom=[m["memory_used_gib"] for m in modes], color=colors, alpha=0.35,
                    label="allocated, not needed")
    memory_axis.axhline(packing["optimum_gib"], color="black", linestyle="--", linewidth=1,
                        label=f"optimum ({packing['optimum_gib']} GiB)")
    memory_axis.set_title("GPU memory (GiB)")
    memory_axis.legend(loc="lower right", fontsize=8)
    for axis, key in ((pods_axis, "pods_placed"), (memory_axis, "ratio_to_optimum")):
        axis.set_xticks(range(len(modes)), labels, fontsize=7)
        for i, m in enumerate(modes):
            text = f"{m[key]}" if key == "pods_placed" else f"{m[key]:.0%}"
            axis.annotate(text, (i, m["pods_placed"] if key == "pods_placed" else m["memory_used_gib"]),
                          ha="center", va="bottom", fontsize=9)
    figure.suptitle(f"{packing['trace']['pods']} inference pods (5-40 GiB) on {packing['gpus']} x {packing['gpu']},"
                    " placed by kube-scheduler", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
