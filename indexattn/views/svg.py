"""Program -> a dataflow diagram as SVG, drawn by plain code (no graphviz): tensors are boxes
in layers from top to bottom, each equation draws arrows from the tensors it reads to the one
it defines, and dashed frames mark what the final program computes in one fused step, read off
its steps' kinds: the projections (one weight read in slices, one matrix product and a split),
the attention core (mask, scores, softmax, weighted sum: one kernel) and returned weights with
their values (one autograd step)."""

from __future__ import annotations

import html
from dataclasses import dataclass

import sympy

from .. import ir
from ..lower.program.program import Program
from ..lower.program.steps import Attention, Linear, SoftmaxValues, Split

CHAR = 8.4  # width of one character of the 14px monospace font
ROW = 92  # from one layer to the next
BOX_HEIGHT = 44
GAP = 26  # between boxes of one layer
MARGIN = 24
FRAME = 12  # between a frame and the boxes inside it
LEGEND = 46
STYLE = {  # fill, stroke
    "input": ("#dbeafe", "#1d4ed8"),
    "param": ("#ffedd5", "#c2410c"),
    "buffer": ("#e5e7eb", "#4b5563"),
    "derived": ("#ffffff", "#374151"),
    "output": ("#dcfce7", "#15803d"),
}
FRAMES = {
    "projection": ("#c2410c", "fused projection"),
    "core": ("#7c3aed", "attention core"),
    "weights": ("#0f766e", "softmax and values, one step"),
}
BANDS = ("left", "projection", "core", "weights", "right")
FUSED = {Attention: "core", SoftmaxValues: "weights"}  # a step that computes its block whole


@dataclass(frozen=True)
class Edge:
    source: ir.Tensor
    target: ir.Tensor
    label: str  # the literal slice read, e.g. "B=0"


@dataclass(frozen=True)
class Box:
    tensor: ir.Tensor
    title: str
    subtitle: str
    role: str
    band: str
    row: int
    x: float  # centre
    width: float
    slice: str = ""  # the literal slice of a fused tensor it is computed from, e.g. "B=0"

    @property
    def y(self) -> float:
        return MARGIN + 20 + self.row * ROW


class Graph:
    """The spec as tensors and arrows (one per tensor an equation reads, labelled with the
    literal slices it reads), built once, with the questions the layout asks."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.spec = spec = program.spec
        found: dict[tuple[ir.Tensor, ir.Tensor], list[str]] = {}
        for eq in spec.equations:
            for ref in ir.refs(eq.rhs):
                labels = found.setdefault((ref.tensor, eq.tensor), [])
                written = [i for axis in ref.axes for i in axis]
                labels += [
                    f"{d.glyph}={v}"
                    for d, v in zip(ref.tensor.indices, written)
                    if isinstance(v, int) and f"{d.glyph}={v}" not in labels
                ]
        self.edges = tuple(Edge(s, t, ",".join(labels)) for (s, t), labels in found.items())
        self.reads: dict[ir.Tensor, list[ir.Tensor]] = {t: [] for t in spec.tensors}
        self.readers: dict[ir.Tensor, list[ir.Tensor]] = {t: [] for t in spec.tensors}
        for e in self.edges:
            self.reads[e.target].append(e.source)
            self.readers[e.source].append(e.target)

    def source(self, tensor: ir.Tensor) -> bool:
        """An argument, or a tensor computed from positions alone (a mask, ALiBi slopes)."""
        return not self.reads[tensor]

    def slices(self, tensor: ir.Tensor) -> str:
        return ",".join(
            dict.fromkeys(e.label for e in self.edges if e.target == tensor and e.label)
        )


def bands(graph: Graph) -> dict[ir.Tensor, str]:
    """Where each tensor is drawn, left to right: what comes before the frames, what the
    program fused, and what comes after."""
    band = fused(graph.program)
    for eq in graph.spec.equations:
        after = any(band.get(t) not in (None, "left", "projection") for t in graph.reads[eq.tensor])
        if eq.tensor not in band and after:
            band[eq.tensor] = "right"
    for t in graph.spec.tensors:
        kinds = {band.get(r) for r in graph.readers[t]}
        if t not in band and graph.source(t) and kinds == {"right"}:
            band[t] = "right"
    return {t: band.get(t, "left") for t in graph.spec.tensors}


def fused(program: Program) -> dict[ir.Tensor, str]:
    """The tensors of each fused step of the final program, by frame: a block holding a kernel
    (`FUSED`) computes all its equations in it, and those of the blocks just before it that a
    pass left without steps (it took them over); a `Linear` whose result is split computes
    every slice of its weight (and bias) in one product."""
    band: dict[ir.Tensor, str] = {}
    taken: list[ir.Tensor] = []  # the equations of blocks without steps since the last one
    for block in program.blocks:
        defined = [*taken, *(eq.tensor for eq in block.equations)]
        taken = defined if not block.steps else []
        split = {s.arg.var for s in block.steps if isinstance(s, Split)}
        for step in block.steps:
            if type(step) in FUSED:
                band.update(dict.fromkeys(defined, FUSED[type(step)]))
            elif isinstance(step, Linear) and step.out.var in split:
                read = [step.weight, *([step.bias] if step.bias is not None else [])]
                band.update(dict.fromkeys([*read, *defined], "projection"))
    return band


# -- layout


def rows(graph: Graph) -> dict[ir.Tensor, int]:
    """Layers: a derived tensor below everything it reads; arguments and fields just above
    their first reader, so that arrows stay short."""
    row: dict[ir.Tensor, int] = {}
    for t in graph.spec.tensors:
        row[t] = 1 + max((row[s] for s in graph.reads[t]), default=-1)
    for t in graph.spec.tensors:
        if graph.source(t) and graph.readers[t]:
            row[t] = min(row[r] for r in graph.readers[t]) - 1
    return row


def layout(graph: Graph) -> tuple[Box, ...]:
    """Boxes in bands left to right; in each band, a layer's boxes centred in its columns."""
    row, band = rows(graph), bands(graph)
    order = _order(graph, row)
    layers = range(max(row.values()) + 1)
    boxes = []
    x0 = MARGIN + FRAME
    for name in BANDS:
        cells = [[t for t in order if band[t] == name and row[t] == r] for r in layers]
        members = [t for line in cells for t in line]
        if not members:
            continue
        width = max(_width(t, graph.spec) for t in members) + GAP
        columns = max(len(line) for line in cells)
        for r, line in enumerate(cells):
            for k, t in enumerate(line):
                x = x0 + (k + (columns - len(line)) / 2) * width + width / 2
                title, subtitle = _texts(t, graph.spec)
                role = "output" if t in graph.spec.outputs else t.role
                size = _width(t, graph.spec)
                boxes.append(Box(t, title, subtitle, role, name, r, x, size, graph.slices(t)))
        x0 += columns * width + 2 * FRAME + GAP
    return tuple(boxes)


def _order(graph: Graph, row: dict) -> list[ir.Tensor]:
    """Within a layer, tensors in the order of the mean position of what they read (one sweep
    down), so that arrows cross little; declaration order breaks ties."""
    place: dict[ir.Tensor, float] = {}
    ordered: list[ir.Tensor] = []
    for r in range(max(row.values()) + 1):
        line = [t for t in graph.spec.tensors if row[t] == r]
        line.sort(key=lambda t: _mean([place[s] for s in graph.reads[t]]))
        place.update({t: float(k) for k, t in enumerate(line)})
        ordered += line
    return ordered


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else -1.0


def _width(tensor: ir.Tensor, spec: ir.Spec) -> float:
    return max(len(text) for text in _texts(tensor, spec)) * CHAR + 20


def _texts(tensor: ir.Tensor, spec: ir.Spec) -> tuple[str, str]:
    if tensor.role != "derived":
        return repr(tensor), tensor.role
    eq = next(e for e in spec.equations if e.tensor == tensor)
    return repr(tensor), operation(eq.rhs)


def operation(node: ir.Node) -> str:
    """What an equation does, in a few characters: `Σ a + M`, `softmax τ'`, `mask`."""
    if isinstance(node, ir.Ref):
        return node.tensor.name
    if isinstance(node, ir.Product):
        inner = [operation(f) for f in node.factors if not isinstance(f, (ir.Ref, ir.Field))]
        if node.summed:
            return " ".join(["Σ " + "".join(i.glyph for i in node.summed), *inner])
        names = [f.tensor.name for f in node.factors if isinstance(f, ir.Ref)]
        rest = ["…"] if len(names) < len(node.factors) else []
        return " × ".join(names + rest)
    if isinstance(node, ir.Sum):
        return " + ".join(operation(t) for t in node.terms)
    if isinstance(node, ir.Reduce):
        return f"{node.fn} {''.join(i.glyph for i in node.over)}"
    if isinstance(node, ir.Apply):
        return node.fn
    if isinstance(node, ir.Concat):
        return f"concat {node.over.glyph}"
    return "mask" if node.expr.has(sympy.oo, -sympy.oo) else "from positions"


# -- drawing


def svg(program: Program) -> str:
    """The diagram of the final program's spec (`CompiledSpec.program`), as a standalone SVG
    document."""
    graph = Graph(program)
    spec = program.spec
    boxes = layout(graph)
    by_tensor = {b.tensor: b for b in boxes}
    width = max(b.x + b.width / 2 for b in boxes) + MARGIN + FRAME
    height = max(b.y for b in boxes) + BOX_HEIGHT + FRAME + MARGIN + LEGEND
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f"<!-- Generated by indexattn from the spec {_comment(spec.name)}. "
        "Edit the spec, not this file. -->",
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="DejaVu Sans Mono, Menlo, '
        'Consolas, monospace" font-size="14">',
        f"<title>{_xml('Dataflow of ' + spec.name)}</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#6b7280"/></marker></defs>',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
    ]
    out += _frames(boxes)
    incoming = {t: sorted({by_tensor[s].x for s in graph.reads[t]}) for t in spec.tensors}
    out += [line for e in graph.edges for line in _arrow(e, by_tensor, incoming)]
    out += [line for b in boxes for line in _box(b)]
    out += _legend(height - LEGEND + 8, {b.role for b in boxes})
    return "\n".join(out) + "\n</svg>\n"


def _frames(boxes: tuple[Box, ...]) -> list[str]:
    out = []
    for name, (colour, label) in FRAMES.items():
        inside = [b for b in boxes if b.band == name]
        if not inside:
            continue
        left = min(b.x - b.width / 2 for b in inside) - FRAME
        right = max(b.x + b.width / 2 for b in inside) + FRAME
        top = min(b.y for b in inside) - FRAME - 6
        bottom = max(b.y for b in inside) + BOX_HEIGHT + FRAME
        out.append(
            f'<rect x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}" '
            f'height="{bottom - top:.1f}" rx="10" fill="{colour}" fill-opacity="0.05" '
            f'stroke="{colour}" stroke-dasharray="6 4"/>'
        )
        out.append(
            f'<text x="{left + 8:.1f}" y="{top - 5:.1f}" font-size="12" fill="{colour}">'
            f"{label}</text>"
        )
    return out


def _arrow(edge: Edge, boxes: dict[ir.Tensor, Box], incoming: dict) -> list[str]:
    """A vertical drop to the gap above the target's layer, then an S-curve into it."""
    a, b = boxes[edge.source], boxes[edge.target]
    x1, y1 = a.x, a.y + BOX_HEIGHT
    x2, y2 = b.x + _spread(b, incoming[edge.target], a.x), b.y
    start = max(y1, y2 - (ROW - BOX_HEIGHT))
    bend = (y2 - start) / 2
    return [
        f'<path d="M{x1:.1f},{y1:.1f} L{x1:.1f},{start:.1f} C{x1:.1f},{start + bend:.1f} '
        f'{x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}" fill="none" stroke="#6b7280" '
        'stroke-width="1.4" marker-end="url(#arrow)"/>'
    ]


def _spread(target: Box, sources: list[float], x: float) -> float:
    """Arrows into one box end side by side, in the order of where they come from."""
    if len(sources) < 2:
        return 0.0
    span = min(target.width - 24, 24 * (len(sources) - 1))
    return -span / 2 + span * sources.index(x) / (len(sources) - 1)


def _box(b: Box) -> list[str]:
    fill, stroke = STYLE[b.role]
    left = b.x - b.width / 2
    weight = "2.4" if b.role == "output" else "1.4"
    out = [
        f'<rect x="{left:.1f}" y="{b.y:.1f}" width="{b.width:.1f}" height="{BOX_HEIGHT}" '
        f'rx="6" fill="{fill}" stroke="{stroke}" stroke-width="{weight}"/>'
    ]
    if b.slice:
        w = len(b.slice) * 7.2 + 8
        out.append(
            f'<rect x="{left + b.width - w + 6:.1f}" y="{b.y - 8:.1f}" width="{w:.1f}" '
            'height="16" rx="3" fill="#ffffff" stroke="#c2410c" stroke-width="0.8"/>'
        )
        out.append(
            f'<text x="{left + b.width - w / 2 + 6:.1f}" y="{b.y + 4:.1f}" font-size="12" '
            f'text-anchor="middle" fill="#c2410c">{_xml(b.slice)}</text>'
        )
    out.append(
        f'<text x="{b.x:.1f}" y="{b.y + 19:.1f}" text-anchor="middle" fill="#111827">'
        f"{_xml(b.title)}</text>"
    )
    out.append(
        f'<text x="{b.x:.1f}" y="{b.y + 36:.1f}" text-anchor="middle" font-size="12" '
        f'fill="#4b5563">{_xml(b.subtitle)}</text>'
    )
    return out


def _legend(y: float, roles: set[str]) -> list[str]:
    out, x = [], MARGIN
    for role, (fill, stroke) in STYLE.items():
        if role not in roles:
            continue
        out.append(
            f'<rect x="{x}" y="{y:.1f}" width="16" height="12" rx="3" fill="{fill}" '
            f'stroke="{stroke}"/>'
        )
        out.append(f'<text x="{x + 22}" y="{y + 11:.1f}" font-size="12">{role}</text>')
        x += 22 + len(role) * 7.2 + 18
    return out


def _xml(value: str) -> str:
    """Text for an SVG element: escaped, and without characters XML cannot hold."""
    kept = "".join(c if c.isprintable() or c == " " else "\ufffd" for c in value)
    return html.escape(kept, quote=True)


def _comment(value: str) -> str:
    """Text for inside an XML comment, which may not hold `--`."""
    return '"' + _xml(value).replace("-", "&#45;") + '"'
