"""The log-log plot of benchmarks/scaling.py: peak memory and time against N, forward and
training step, each spec a colour, the spec solid and its blocked baseline dashed. Needs
matplotlib, a benchmark-only dependency (`pip install matplotlib`), never a runtime one."""

from __future__ import annotations

import io

PANELS = (("MB", "peak memory (MB)"), ("s", "time (s)"))
MODES = (("forward", "forward"), ("train", "training step"))


def svg(records: list[dict], specs: tuple[str, ...], title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "indexattn-scaling"  # the same file for the same figures
    figure, axes = plt.subplots(2, 2, figsize=(11, 8.5), sharex=True)
    for col, (mode, label) in enumerate(MODES):
        for row, (key, unit) in enumerate(PANELS):
            panel = axes[row][col]
            for i, name in enumerate(specs):
                draw(panel, [r for r in records if (r["name"], r["mode"]) == (name, mode)], key, i)
            panel.set(xscale="log", yscale="log", ylabel=unit, title=f"{label}: {unit}")
            panel.set_xscale("log", base=2)
            panel.grid(True, which="major", alpha=0.3)
    for panel in axes[1]:
        panel.set_xlabel("N")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=5, fontsize="small")
    figure.suptitle(f"{title} (solid: the spec; dashed: its blocked hand-written baseline)")
    figure.tight_layout(rect=(0, 0.08, 1, 0.97))
    out = io.StringIO()
    figure.savefig(out, format="svg", metadata={"Date": None})
    plt.close(figure)
    return out.getvalue()


def draw(panel, records: list[dict], key: str, colour: int) -> None:
    for who, style in (("spec", "-"), ("hand", "--")):
        points = sorted((r["n"], max(r[key], 0.1)) for r in records if r["who"] == who)
        if points:
            name = records[0]["name"] if who == "spec" else None
            panel.plot(*zip(*points), style, color=f"C{colour}", marker="o", ms=3, label=name)
