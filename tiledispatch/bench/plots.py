"""The plot the GEMM and conv benchmarks share: each case's speed relative to the vendor library."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

PROVIDERS = (("selected_ms", "Triton, rules pick", "o"), ("oracle_ms", "Triton, oracle", "^"),
             ("dispatcher_ms", "dispatcher (with {vendor})", "s"))


def plot_speed_vs_vendor(entries: list[dict], path: Path, *, vendor: str, vendor_key: str,
                         label: Callable[[dict], str]) -> None:
    """One panel per dtype, log scale: vendor time / provider time for the rules' pick, the
    oracle and the dispatcher, one column per case (`label` names it). Skipped, with a line
    saying so, when matplotlib (the `bench` extra) is missing."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is missing (the `bench` extra): no plot", flush=True)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({e["dtype"] for e in entries})
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(18, 5 * len(dtypes)), squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes):
        subset = [e for e in entries if e["dtype"] == dtype]
        x = range(len(subset))
        for key, name, marker in PROVIDERS:
            ys = [e[vendor_key] / e[key] if e.get(vendor_key) and e.get(key) else float("nan") for e in subset]
            ax.scatter(x, ys, label=name.format(vendor=vendor), marker=marker, s=22)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylabel(f"{dtype}: speed / {vendor}")
        ax.set_xticks(list(x))
        ax.set_xticklabels([label(e) for e in subset], rotation=80, fontsize=6)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
