"""Facts -> spec text: every atom a glyph (its hint where free, τ and its primes along the
sequence, one glyph shared by atoms of one size that never meet in an equation), every range
a size symbol whose value the lifted module holds, then the declarations and equations."""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy

from ..notation.names import ascii_name
from .atoms import Atom, leaves
from .expr import Num, Op, Ref, Size, Softmax, Var
from .facts import Facts

SIZES = {"μ": "h", "a": "d_k", "i": "d_m", "g": "h_kv", "r": "n_rep", "j": "d_r", "τ": "N"}
LITERAL = frozenset({"c", "B"})  # ranges written as numbers: halves, the q/k/v selector
POOL = "klmnpqstuvwxyz"
LEVEL = {"or": 1, "and": 2, "not": 3, "+": 5, "-": 5, "*": 6, "/": 6, "neg": 7, "^": 8}
COMPARISON = frozenset({"<", "<=", ">", ">=", "==", "!="})


@dataclass(frozen=True)
class Text:
    """The spec's text, the sizes its module is built at, and each param or buffer's spec
    name with its state_dict key in the module lifted."""

    text: str
    sizes: dict
    weights: tuple[tuple[str, str], ...]
    inputs: tuple[str, ...]


def spec_text(facts: Facts, title: str) -> Text:
    return Printer(facts).text(title)


class Printer:
    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self.batch = {find_id for find_id in facts.batch}
        self.glyphs: dict[int, str] = {}
        self.atoms: dict[int, Atom] = {}
        self.meets: dict[int, set[int]] = {}
        for tensor in facts.tensors:
            self.meet(_layout_leaves(tensor.layout))
        for tensor, expr in facts.equations:
            self.meet(_layout_leaves(tensor.layout) + _expr_leaves(expr))
        self.names = {t.name for t in facts.tensors}
        self.assign()
        self.sizes, self.range = self.ranges()

    def meet(self, atoms: list[Atom]) -> None:
        ids = [a.id for a in atoms if self.kept(a)]
        for a in atoms:
            if self.kept(a):
                self.atoms.setdefault(a.id, a)
                self.meets.setdefault(a.id, set()).update(ids)

    def kept(self, atom: Atom) -> bool:
        return atom.id not in self.batch and atom.size != 1

    def along(self, atom: Atom) -> bool:
        return bool(atom.size.free_symbols & self.facts.sequence)

    def assign(self) -> None:
        holders: dict[str, list[Atom]] = {}
        for atom in self.atoms.values():
            hint = "τ" if self.along(atom) else (atom.hint if len(atom.hint) == 1 else "")
            for glyph in _candidates(hint):
                if glyph in self.names:
                    continue
                held = holders.get(glyph, [])
                if all(
                    sympy.simplify(h.size - atom.size) == 0 and h.id not in self.meets[atom.id]
                    for h in held
                ):
                    holders.setdefault(glyph, []).append(atom)
                    self.glyphs[atom.id] = glyph
                    break
        self.holders = holders

    # -- text

    def text(self, title: str) -> Text:
        lines = [
            f"# {title}",
            "#",
            "# Lifted by indexattn.lift from the module's exported graph.",
            "",
        ]
        sizes, ranges = self.sizes, self.range
        by_range: dict[str, list[str]] = {}
        for glyph in self.holders:
            by_range.setdefault(ranges[glyph], []).append(glyph)
        for size, glyphs in by_range.items():
            lines.append(f"index {', '.join(glyphs)} : {size}")
        lines.append("")
        weights, inputs = [], []
        for tensor in self.facts.tensors:
            if tensor.role == "derived":
                continue
            dtype = " : int" if tensor.dtype == "int" else ""
            lines.append(
                f"{tensor.role:<6} {tensor.name}_<{self.layout(tensor.layout, True)}>{dtype}"
            )
            if tensor.role == "input":
                inputs.append(tensor.name)
            else:
                weights.append((tensor.name, tensor.target))
        lines.append("")
        for tensor, expr in self.facts.equations:
            lines.append(f"{tensor.name}_<{self.layout(tensor.layout, False)}> = {self.expr(expr)}")
        lines += ["", "output " + ", ".join(t.name for t in self.facts.outputs), ""]
        return Text("\n".join(lines), sizes, tuple(weights), tuple(inputs))

    def ranges(self) -> tuple[dict, dict]:
        """Each glyph's range: N along the sequence, a number for halves and selectors, else
        a size symbol named by its glyph's letter, whose value the module is given."""
        sizes, ranges, taken = {}, {}, set(self.names)
        for glyph, atoms in self.holders.items():
            size = atoms[0].size
            letter = glyph.rstrip("'")
            if self.along(atoms[0]):
                ranges[glyph] = "N" if size.is_Symbol else _size_text(size)
                continue
            if letter in LITERAL:
                ranges[glyph] = str(int(size))
                continue
            base = SIZES.get(letter, "n_" + ascii_name(letter))
            name = next(
                n
                for n in (base, *(f"{base}_{k}" for k in range(2, 99)))
                if n not in taken or sizes.get(n) == int(size)
            )
            taken.add(name)
            sizes[name] = int(size)
            ranges[glyph] = name
        return sizes, ranges

    def layout(self, layout, grouped: bool) -> str:
        out = []
        for axis in layout:
            items = [self.glyphs[a.id] for s in axis for a in leaves(s) if self.kept(a)]
            if grouped and len(items) > 1:
                out.append("(" + "".join(items) + ")")
            else:
                out += items
        return "".join(out)

    def ref(self, ref: Ref) -> str:
        out = []
        for axis in ref.axes:
            items = []
            for s in axis:
                if isinstance(s, Atom):
                    items += [self.glyphs[a.id] for a in leaves(s) if self.kept(a)]
                elif isinstance(s, tuple):  # ("pos", expr): a computed position
                    items.append("[" + self.expr(s[1]) + "]")
                else:
                    items.append(str(s) if s < 10 else f"[{s}]")
            if not ref.derived and len(items) > 1:
                out.append("(" + "".join(items) + ")")
            else:
                out += items
        return f"{ref.name}_<{''.join(out)}>"

    def expr(self, node, outer: int = 0) -> str:
        if isinstance(node, Ref):
            return self.ref(node)
        if isinstance(node, Var):
            (atom,) = [a for a in leaves(node.atom)]
            return self.glyphs[atom.id]
        if isinstance(node, Num):
            return _number(node.value, outer)
        if isinstance(node, Size):
            return " ".join(self.range[self.glyphs[a.id]] for s in node.atoms for a in leaves(s))
        if isinstance(node, Softmax):
            (atom,) = leaves(node.atom)
            return f"softmax_<{self.glyphs[atom.id]}>({self.expr(node.arg)})"
        return self.op(node, outer)

    def op(self, node: Op, outer: int) -> str:
        op, args = node.op, node.args
        if op == "where":
            return "where(" + ", ".join(self.expr(a) for a in args) + ")"
        if op in COMPARISON:
            text, level = f"{self.expr(args[0], 5)} {op} {self.expr(args[1], 5)}", 4
        elif op in ("neg", "not"):
            level = LEVEL[op]
            text = ("-" if op == "neg" else "not ") + self.expr(args[0], level + 1)
        elif op in LEVEL:
            level = LEVEL[op]
            left, right = self.expr(args[0], level), self.expr(args[1], level + 1)
            text = (
                f"{left} {right}"
                if op == "*"
                else f"{left}^{right}"
                if op == "^"
                else f"{left} {op} {right}"
            )
        else:
            return f"{op}(" + ", ".join(self.expr(a) for a in args) + ")"
        return f"({text})" if level < outer else text


def _candidates(hint: str):
    if hint:
        yield from (hint + "'" * k for k in range(4))
    yield from POOL
    yield from (p + "'" for p in POOL)


def _layout_leaves(layout) -> list[Atom]:
    return [a for axis in layout for s in axis for a in leaves(s)]


def _expr_leaves(expr) -> list[Atom]:
    from .expr import atoms_of

    out = atoms_of(expr)
    if isinstance(expr, Op):
        for a in expr.args:
            if isinstance(a, Ref):
                for axis in a.axes:
                    for s in axis:
                        if isinstance(s, tuple):
                            out += atoms_of(s[1])
    return out


def _size_text(size) -> str:
    return str(size)


def _number(value: float, outer: int) -> str:
    if math.isinf(value):
        text = "inf" if value > 0 else "-inf"
    elif value == int(value) and abs(value) < 2**53:
        text = str(int(value))
    else:
        text = repr(value)
    return f"({text})" if text.startswith("-") and outer > 5 else text
