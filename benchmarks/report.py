"""docs/performance.md's tables and its plots, from the figures kept in benchmarks/*.json.

The one writer of the page's figures: every table sits between `<!-- table: NAME -->` and
`<!-- end NAME -->`, and this script rewrites what is between them, and the plots
(docs/scaling.svg, docs/ratios.svg), from the JSON files the benchmarks write (results.json:
benchmarks/run.py; scaling.json: benchmarks/scaling.py; flex.json: benchmarks/flex.py) or that
keep a run transcribed with its conditions (independent.json, gpu_h200.json, layers.json,
models.json). No torch, no matplotlib: the SVG is written directly.

    .venv/bin/python benchmarks/report.py            # rewrite the page's tables and the plots
    .venv/bin/python benchmarks/report.py --check    # exit 1 if the page or a plot is stale
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks"
PAGE = ROOT / "docs" / "performance.md"
SOURCES = ("results", "scaling", "flex", "independent", "gpu_h200", "gpu_h200_second", "layers")
SOURCES += ("models",)
SCALING_SPECS = (
    "mha",
    "sliding_window",
    "softcap_window",
    "alibi",
    "t5_bias",
    "doc_mask",
    "attention_sinks",
    "differential",
    "retention",
    "linear_attention_causal",
)
# The one run of benchmarks/scaling.py that measured all ten specs and their baselines,
# a spec then its baseline, at load 1.1 to 2.2: these N, per mode (the other records in
# scaling.json come from single runs at long N, measured one at a time).
ONE_RUN = {"forward": (512, 2048, 8192), "train": (512, 2048)}
LONG_N = 32768
FULL_RUN_COLUMNS = (
    ((1, 512), "forward"),
    ((1, 512), "forward+backward"),
    ((1, 2048), "forward"),
    ((1, 2048), "forward+backward"),
)


def load() -> dict:
    return {name: json.loads((HERE / f"{name}.json").read_text("utf-8")) for name in SOURCES}


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def head(*names: str, left: int = 1) -> list[str]:
    """A table's header: the first `left` columns aligned left, the others right."""
    rule = ["---"] * left + ["---:"] * (len(names) - left)
    return [row(*names), row(*rule)]


def full_run(results: dict) -> str:
    """× hand per case at the four shapes and modes, peak MB at (1, 2048), and compiled
    FlexAttention's forward over the generated one's where it runs."""
    by = {(t["case"], tuple(t["shape"]), t["mode"]): t for t in results["timings"]}
    peak = {m["case"]: m for m in results["memory"]}
    names = ("fwd 512", "f+b 512", "fwd 2048", "f+b 2048", "peak MB (hand)", "flex ÷ gen 2048")
    lines = head("case", *names)
    for case in sorted({t["case"] for t in results["timings"]}):
        cells = [
            f"{by[case, s, m]['vs_hand']:.2f}" if (case, s, m) in by else ""
            for s, m in FULL_RUN_COLUMNS
        ]
        memory = peak.get(case)
        cells.append(f"{memory['generated']:.0f} ({memory['eager']:.0f})" if memory else "")
        flex = by.get((case, (1, 2048), "forward"), {}).get("ratio", {}).get("flex")
        cells.append(f"{flex:.2f}" if flex else "")
        lines.append(row(case, *cells))
    return "\n".join(lines)


def decode(results: dict) -> str:
    lines = head("case", "cached keys", "mode", "generated ms", "× hand", left=3)
    for t in results["timings"]:
        if len(t["shape"]) == 3:
            lines.append(
                row(
                    t["case"],
                    t["shape"][2],
                    t["mode"],
                    f"{t['ms']['generated']:.3g}",
                    f"{t['vs_hand']:.2f}",
                )
            )
    return "\n".join(lines)


def scaling_pairs(records: list[dict], mode: str, sizes) -> list[tuple[dict, dict]]:
    found = {(r["name"], r["n"], r["who"]): r for r in records if r["mode"] == mode}
    return [
        (found[s, n, "spec"], found[s, n, "hand"])
        for s in SCALING_SPECS
        for n in sizes
        if (s, n, "spec") in found and (s, n, "hand") in found
    ]


def long_n(records: list[dict]) -> str:
    """At N = 32768: peak MB of the spec and of its blocked baseline, and the time ratio."""
    lines = head(
        "spec", "forward MB (blocked)", "time ÷ blocked", "training MB (blocked)", "time ÷ blocked"
    )
    pairs = {
        m: dict((s["name"], (s, h)) for s, h in scaling_pairs(records, m, (LONG_N,)))
        for m in ONE_RUN
    }
    for name in SCALING_SPECS:
        cells = []
        for mode in ("forward", "train"):
            s, h = pairs[mode][name]
            cells += [f"{s['MB']:.0f} ({h['MB']:.0f})", f"{s['s'] / h['s']:.2f}"]
        lines.append(row(name, *cells))
    return "\n".join(lines)


def one_run(records: list[dict]) -> str:
    """The one run's ratios against the blocked baseline: memory and time, per N and mode."""
    columns = [(m, n) for m, sizes in ONE_RUN.items() for n in sizes]
    lines = head("spec", *(f"{'train' if m == 'train' else 'fwd'} {n}" for m, n in columns))
    pairs = {
        (s["name"], s["mode"], s["n"]): (s, h)
        for m, ns in ONE_RUN.items()
        for s, h in scaling_pairs(records, m, ns)
    }
    for name in SCALING_SPECS:
        cells = []
        for mode, n in columns:
            s, h = pairs[name, mode, n]
            cells.append(f"{s['MB'] / h['MB']:.2f} / {s['s'] / h['s']:.2f}")
        lines.append(row(name, *cells))
    return "\n".join(lines)


def ranged(r: dict, fmt: str = ".2f") -> str:
    lo, hi = r["range"]
    return f"{r['ratio']:{fmt}} ({lo:{fmt}}–{hi:{fmt}})"


def independent(data: dict) -> str:
    lines = head("case", "baseline", "N", "forward", "forward+backward", left=2)
    rows: dict = {}
    for r in data["rows"]:
        rows.setdefault((r["case"], r["N"]), {})[r["mode"]] = r
    for (case, n), modes in rows.items():
        f, b = modes.get("forward"), modes.get("forward+backward")
        baseline = " / ".join(dict.fromkeys(m["baseline"] for m in modes.values()))
        lines.append(row(case, baseline, n, ranged(f), ranged(b) if b else "no CPU backward"))
    return "\n".join(lines)


def gpu(data: dict) -> str:
    lines = head("case", "baseline", "forward", "forward+backward", left=2)
    rows: dict = {}
    for r in data["rows"]:
        rows.setdefault((r["case"], r["baseline"]), {})[r["mode"]] = r
    for (case, baseline), modes in rows.items():
        cells = [gpu_cell(modes[m]) for m in ("forward", "forward+backward")]
        lines.append(row(case, baseline, *cells))
    return "\n".join(lines)


def gpu_cell(r: dict) -> str:
    if r["ratio"] is None:
        return r["note"]
    return f"{ranged(r, 'g')}; {r['generated_ms']:g} vs {r['baseline_ms']:g} ms"


def triton_gpu(data: dict) -> str:
    """benchmarks/triton_gpu.py's rows: forward and forward+backward ms (peak MB) per path."""
    lines = head("spec", "N", "kernels", "FlexAttention", "blocks", left=1)
    for r in data["triton"]:
        flex = triton_cell(r, "flex") if "flex_forward" in r else "does not take it"
        lines.append(
            row(r["spec"], r["N"], triton_cell(r, "triton"), flex, triton_cell(r, "blocks"))
        )
    return "\n".join(lines)


def triton_cell(r: dict, path: str) -> str:
    f, t = r[f"{path}_forward"], r[f"{path}_train"]
    return f"{f['s'] * 1e3:.3g} ({f['peak_MB']:.0f}), {t['s'] * 1e3:.3g} ({t['peak_MB']:.0f})"


def flex_cpu(data: dict) -> str:
    lines = head("core", "N", "hand-written flex ms", '`backend="flex"`', "`auto`")
    for c in (c for c in data["cores"] if "ms" in c):  # an N that failed keeps its error only
        hand = c["ms"]["flex (hand-written)"]
        ratios = [f"{c['ratio'][k]:.2f}×" for k in ('backend="flex"', "auto")]
        lines.append(row(c["case"], c["N"], f"{hand:.1f}", *ratios))
    return "\n".join(lines)


def block_masks(data: dict) -> str:
    lines = head("N", "`block_mask` ms", "`create_block_mask` ms", "ratio", "equal", left=1)
    for m in data["masks"]:
        lines.append(
            row(
                m["N"],
                f"{m['block_mask']:.0f}",
                f"{m['create_block_mask']:.0f}",
                f"{m['ratio']:.1f}×",
                m["equal"],
            )
        )
    return "\n".join(lines)


def layers(data: dict) -> str:
    lines = head("layer", "N", "mode", "generated ms", "transformers ms", "× transformers", left=3)
    for r in data["rows"]:
        lines.append(
            row(r["layer"], r["N"], r["mode"], r["generated_ms"], r["transformers_ms"], ranged(r))
        )
    return "\n".join(lines)


def models(data: dict) -> str:
    lines = head("run", "sdpa s", "indexattn s", "eager s", "indexattn ÷ sdpa", "eager ÷ sdpa")
    for r in data["rows"]:
        cells = (r["sdpa_s"], r["indexattn_s"], r["eager_s"])
        ratios = (f"{r['indexattn_over_sdpa']:.2f}", f"{r['eager_over_sdpa']:.2f}")
        lines.append(row(r["what"], *(f"{c:g}" for c in cells), *ratios))
    return "\n".join(lines)


def shape_text(shape) -> str:
    return (
        f"decode ({shape[0]}, {shape[1]}, cache {shape[2]})"
        if len(shape) == 3
        else str(tuple(shape))
    )


def startup_table(times: dict) -> list[str]:
    lines = ["| spec | cold s (never seen) | warm s (cached) |", "|---|---:|---:|"]
    return lines + [
        f"| {name} | {t:.3f} | {times['warm'][name]:.3f} |" for name, t in times["cold"].items()
    ]


def bf16_table(results: dict) -> list[str]:
    lines = ["| case | shape | float32 ms | bfloat16 ms | speed-up |", "|---|---|---:|---:|---:|"]
    for row in results["bfloat16"]:
        ms = row["ms"]
        cells = [
            row["case"],
            shape_text(row["shape"]),
            f"{ms['float32']:.3g}",
            f"{ms['bfloat16']:.3g}",
        ]
        lines.append("| " + " | ".join([*cells, f"{row['speedup']:.2f}"]) + " |")
    return lines


def tables(data: dict) -> dict[str, str]:
    return {
        "full-run": full_run(data["results"]),
        "decode": decode(data["results"]),
        "long-n": long_n(data["scaling"]),
        "one-run": one_run(data["scaling"]),
        "independent": independent(data["independent"]),
        "gpu": gpu(data["gpu_h200"]),
        "triton-gpu": triton_gpu(data["gpu_h200_second"]),
        "flex-cpu": flex_cpu(data["flex"]),
        "block-masks": block_masks(data["flex"]),
        "layers": layers(data["layers"]),
        "models": models(data["models"]),
        "startup": "\n".join(startup_table(data["results"]["startup"])),
        "bfloat16": "\n".join(bf16_table(data["results"])),
    }


def render(page: str, made: dict[str, str]) -> str:
    """The page with each marked table replaced by the one made from the JSON."""

    def fill(match: re.Match) -> str:
        name = match[1]
        if name not in made:
            raise KeyError(f"performance.md marks a table {name!r} that report.py does not make")
        return f"<!-- table: {name} -->\n{made[name]}\n<!-- end {name} -->"

    return re.sub(r"<!-- table: ([\w-]+) -->\n.*?<!-- end \1 -->", fill, page, flags=re.S)


# --- plots: SVG written directly -------------------------------------------------------------

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
COLOURS += ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def el(name: str, text: str | None = None, **attrs) -> str:
    """One SVG element; attribute names with `_` are written with `-`."""
    spelled = " ".join(f'{k.rstrip("_").replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f"<{name} {spelled}/>" if text is None else f"<{name} {spelled}>{text}</{name}>"


def padded(values, pad: float) -> tuple[float, float]:
    """The log10 range of the values, widened by `pad` of it each side (0.05 at least)."""
    lo, hi = math.log10(min(values)), math.log10(max(values))
    extra = max(pad * (hi - lo), 0.05)
    return lo - extra, hi + extra


def ticks(lo: float, hi: float) -> list[float]:
    """Round values inside a log10 range: finer within a decade, only powers over many."""
    steps = (1, 1.2, 1.5, 2, 3, 5, 7) if hi - lo < 1 else (1, 2, 5) if hi - lo <= 3.5 else (1,)
    found = [m * 10.0**e for e in range(math.floor(lo), math.ceil(hi) + 1) for m in steps]
    return [t for t in found if lo <= math.log10(t) <= hi]


class Panel:
    """A box with a log y axis and a log x axis, mapping values to pixels."""

    def __init__(self, box, xs, ys):
        self.box = box
        self.x0, self.x1 = padded(xs, 0.04)
        self.y0, self.y1 = padded(ys, 0.06)

    def px(self, x: float, y: float) -> tuple[float, float]:
        left, top, width, height = self.box
        u = (math.log10(x) - self.x0) / (self.x1 - self.x0)
        v = (math.log10(y) - self.y0) / (self.y1 - self.y0)
        return round(left + u * width, 1), round(top + height - v * height, 1)

    def frame(self, title: str) -> list[str]:
        left, top, width, height = self.box
        out = [el("rect", x=left, y=top, width=width, height=height, fill="none", stroke="#444")]
        out.append(el("text", title, x=left, y=top - 8, font_size=13))
        return out

    def y_grid(self, label: str) -> list[str]:
        left, _, width, _ = self.box
        out = []
        for tick in ticks(self.y0, self.y1):
            _, y = self.px(10**self.x0, tick)
            out.append(el("line", x1=left, x2=left + width, y1=y, y2=y, stroke="#ddd"))
            out.append(
                el("text", f"{tick:g}", x=left - 4, y=y + 4, text_anchor="end", font_size=10)
            )
        return [*out, el("text", label, x=left - 50, y=self.box[1] - 8, font_size=11)]

    def x_grid(self, values, label: str) -> list[str]:
        _, top, _, height = self.box
        out = []
        for tick in values:
            x, _ = self.px(tick, 10**self.y0)
            colour = "#444" if tick == 1 else "#ddd"
            out.append(el("line", x1=x, x2=x, y1=top, y2=top + height, stroke=colour))
            out.append(
                el(
                    "text",
                    f"{tick:g}",
                    x=x,
                    y=top + height + 13,
                    text_anchor="middle",
                    font_size=10,
                )
            )
        x = self.box[0] + self.box[2] / 2
        return [
            *out,
            el("text", label, x=x, y=top + height + 28, text_anchor="middle", font_size=11),
        ]


def polyline(points, colour: str, dashed: bool) -> str:
    dash = {"stroke_dasharray": "5,3"} if dashed else {}
    path = " ".join(f"{x},{y}" for x, y in points)
    line = el("polyline", points=path, fill="none", stroke=colour, stroke_width=1.5, **dash)
    return line + "".join(el("circle", cx=x, cy=y, r=2.5, fill=colour) for x, y in points)


def svg_page(width: int, height: int, title: str, body: list[str]) -> str:
    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
    head += f'viewBox="0 0 {width} {height}" font-family="sans-serif">'
    parts = [head, el("rect", width=width, height=height, fill="white")]
    parts += [el("text", title, x=20, y=22, font_size=13), *body, "</svg>"]
    return "\n".join(parts) + "\n"


def scaling_svg(records: list[dict]) -> str:
    """The one run: peak MB and time against N, forward and training step; solid the spec,
    dashed its blocked baseline; both axes logarithmic, every figure drawn where it is."""
    body = []
    for i, (key, mode) in enumerate((k, m) for k in ("MB", "s") for m in ONE_RUN):
        chosen = [r for r in records if r["mode"] == mode and r["n"] in ONE_RUN[mode]]
        panel = Panel((80 + (i % 2) * 480, 50 + (i // 2) * 330, 380, 250), *axes_of(chosen, key))
        what = "training step" if mode == "train" else "forward"
        body += panel.frame(f"{what}: {'peak memory growth' if key == 'MB' else 'time'}")
        body += panel.y_grid("MB" if key == "MB" else "s")
        body += panel.x_grid(ONE_RUN[mode], "N")
        for colour, name in zip(COLOURS, SCALING_SPECS):
            for who in ("spec", "hand"):
                mine = (r for r in chosen if (r["name"], r["who"]) == (name, who))
                points = sorted((r["n"], r[key]) for r in mine)
                body.append(polyline([panel.px(*p) for p in points], colour, who == "hand"))
    body += legend(SCALING_SPECS, 80, 700)
    title = "benchmarks/scaling.py, one run (load 1.1–2.2, one thread, float32): "
    return svg_page(960, 750, title + "solid the spec, dashed its blocked baseline", body)


def axes_of(records: list[dict], key: str) -> tuple[list, list]:
    return [r["n"] for r in records], [r[key] for r in records]


def legend(names, left: int, top: int) -> list[str]:
    out = []
    for c, name in enumerate(names):
        x, y = left + (c % 5) * 175, top + (c // 5) * 18
        out.append(el("line", x1=x, x2=x + 20, y1=y, y2=y, stroke=COLOURS[c], stroke_width=2))
        out.append(el("text", name, x=x + 25, y=y + 4, font_size=11))
    return out


def ratio_families(data: dict) -> list[tuple[str, list[tuple[str, float]]]]:
    """Per family of baseline, (case, the generated time over the baseline's)."""
    forward = [t for t in data["results"]["timings"] if t["shape"] == [1, 2048]]
    forward = [t for t in forward if t["mode"] == "forward"]
    hand = [(t["case"], t["vs_hand"]) for t in forward]
    flex = [(t["case"], 1 / t["ratio"]["flex"]) for t in forward if t["ratio"].get("flex")]
    pairs = scaling_pairs(data["scaling"], "train", (LONG_N,))
    blocked = [(s["name"], s["s"] / h["s"]) for s, h in pairs]
    rows = data["gpu_h200"]["rows"]
    cuda = [(r["case"], r["ratio"]) for r in rows if r["mode"] == "forward" and r["ratio"]]
    return [
        ("against the best hand-written code, CPU, forward at (1, 2048)", hand),
        ("against compiled FlexAttention, CPU, forward at (1, 2048)", flex),
        (f"against the blocked baseline, CPU, training step at N = {LONG_N}", blocked),
        ("against the best baseline on the H200, forward at N = 8192", cuda),
    ]


def ratios_svg(data: dict) -> str:
    """One panel per family of baseline: the generated time over the baseline's on a log
    axis, the line at 1 (left of it the generated code is faster)."""
    body, top = [], 50
    for title, points in ratio_families(data):
        height = 14 * len(points) + 14
        panel = Panel((230, top, 510, height), [v for _, v in points] + [1.0], [1.0])
        body += panel.frame(title)
        body += panel.x_grid(ticks(panel.x0, panel.x1), "generated time ÷ baseline time")
        for k, (case, value) in enumerate(sorted(points, key=lambda p: p[1])):
            x, y = panel.px(value, 1)[0], top + 14 + 14 * k
            colour = COLOURS[0] if value <= 1 else COLOURS[3]
            body.append(el("text", case, x=224, y=y + 4, text_anchor="end", font_size=10))
            body.append(el("circle", cx=x, cy=y, r=3, fill=colour))
            body.append(el("text", f"{value:.2f}", x=x + 6, y=y + 4, font_size=9))
        top += height + 70
    title = "Generated time over baseline time, log axis: left of 1 the generated code is faster"
    return svg_page(800, top - 30, title, body)


def plots(data: dict) -> dict[Path, str]:
    docs = ROOT / "docs"
    return {
        docs / "scaling.svg": scaling_svg(data["scaling"]),
        docs / "ratios.svg": ratios_svg(data),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if anything is stale")
    args = parser.parse_args()
    data = load()
    wanted = {PAGE: render(PAGE.read_text("utf-8"), tables(data)), **plots(data)}
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text("utf-8") != text]
    if args.check:
        print("\n".join(f"stale: {p.relative_to(ROOT)}" for p in stale))
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path], encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
