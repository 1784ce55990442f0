"""Reverse mode over the IR: each equation, last to first, sends its left side's cotangent to
what its right side reads. A contraction's cotangent is the other factors times the
cotangent, its indices renamed, never transposed; the cotangents of one tensor are summed in
one equation; a literal slice or a computed position is scattered back by `where` on the
index it selects; a where's branches are differentiated as the forward evaluates them. This
alone is correct; the rewrites of derive/rewrites.py then write some steps otherwise."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace

import sympy

from ..errors import SpecError
from ..ir import (
    Apply,
    At,
    Concat,
    Equation,
    Field,
    Index,
    Node,
    Product,
    Reduce,
    Ref,
    Scalar,
    Spec,
    Sum,
    Tensor,
    batched,
    children,
    is_condition,
    printer,
    walk,
)
from ..lower.numerics import guarded
from ..notation.names import ascii_name, fresh
from ..ops import DERIVATIVES


@dataclass(frozen=True)
class Cot:
    """A cotangent (or a value) as a factor of a product: its text, the indices it carries
    and every index it mentions (those it sums inside included)."""

    text: str
    free: frozenset[Index]
    mentions: frozenset[Index] = frozenset()
    layout: tuple[tuple[Index, ...], ...] = ()  # a reference's axes, when it is one
    factors: tuple[Cot, ...] = ()  # a product's factors, when it sums nothing explicitly
    ref: Ref | None = None  # the forward's reference, when the factor is one

    @property
    def all(self) -> frozenset[Index]:
        return self.free | self.mentions


@dataclass(frozen=True)
class Part:
    """One contribution to a tensor's cotangent: through `ref`, in the names `ref` is
    written with."""

    ref: Ref
    cot: Cot


@dataclass
class Backward:
    """What the derivation writes: new index lines, cotangent inputs, equations, outputs."""

    indices: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    equations: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    given: list[Tensor] = field(default_factory=list)  # the outputs with a cotangent input
    reached: list[Tensor] = field(default_factory=list)  # the arguments with a cotangent
    scalars: list[Scalar] = field(default_factory=list)  # the scalars with one, after them
    masks: dict[int, Tensor] = field(default_factory=dict)  # id of a dropout -> its mask


class Derivation:
    """The backward of one checked spec."""

    def __init__(
        self,
        spec: Spec,
        source: str,
        file: str,
        training: bool = True,
        scalars=frozenset(),
        rewrites: tuple = (),  # derive/rewrites.py's Rewrite values (it imports this module)
    ) -> None:
        self.spec, self.source, self.file = spec, source, file
        self.rewrites = rewrites  # BACKWARD_REWRITES, or a prefix of it: none is reverse mode
        self.training = training  # False: dropout is the identity, as in eval mode
        # the scalars (ASCII names) whose cotangent is asked for: a tensor scalar that
        # requires grad (a learnable soft cap), reached through the fields that read it
        self.symbols = {s.symbol: s for s in spec.scalars if s.ascii in scalars}
        self.scalar_parts: dict[Scalar, list[str]] = {}
        self.out = Backward()
        self.taken = {t.name for t in spec.tensors} | {s.name for s in spec.scalars}
        self.taken |= {str(s) for s in spec.sizes} | {i.glyph for i in spec.indices}
        self.parts: dict[Tensor, list[Part]] = {}
        self.differentiable = self._differentiable()
        self.eq: Equation | None = None
        self.names: dict[Tensor, str] = {}  # each tensor's cotangent, once accumulated
        # Common subexpressions: a node equal to an equation's right side is its left side;
        # any other value the backward reads is named once.
        self.defined = {eq.rhs: eq.tensor for eq in spec.equations}
        self.values: dict[Node, Cot] = {}
        self.once: dict[tuple, Cot] = {}  # what the rewrites name once per derivation, by key
        if training:
            self.out.masks = {id(n): self.mask(n, eq) for eq, n in dropouts(spec)}

    def mask(self, node: Apply, eq: Equation) -> Tensor:
        """`dropout(E, p)` is `E Ξ` in training: Ξ, over E's indices, is what F.dropout makes
        of ones (0, or 1 / (1 - p)), drawn by the forward and read by the backward. Its axes
        are in the order the forward lays E out (a reference's own, else the equation's left
        side's first), so that both draw the same mask."""
        name, arg = self.fresh("Ξ"), node.args[0]
        free = arg.free if isinstance(arg, Ref) else (*eq.indices, *arg.free)
        layout = tuple((i,) for i in dict.fromkeys(free) if i in arg.free)
        return Tensor(name, ascii_name(name), "input", layout, batched(arg), span=node.span)

    def rewritten(self, hook: str, plain, *context):
        """`plain`, a step as reverse mode proper writes it, through each rewrite of that
        step in the list's order (each returns it as it found it where it does not apply)."""
        for rewrite in self.rewrites:
            if rewrite.hook == hook:
                plain = rewrite.run(self, plain, *context)
        return plain

    # -- names

    def fresh(self, base: str) -> str:
        return fresh(base, self.taken)

    def fresh_index(self, index: Index) -> str:
        glyph = index.glyph + "'"
        while glyph in self.taken:
            glyph += "'"
        self.taken.add(glyph)
        self.out.indices.append(f"index {glyph} : {printer.field(index.size)}")
        return glyph

    def refuse(self, what: str, node: Node, hint: str) -> SpecError:
        where = f" (in {self.eq.text})" if self.eq else ""
        return SpecError(
            f"no derived backward for {what}{where}",
            source=self.source,
            file=self.file,
            span=node.span,
            hint=hint,
        )

    # -- the walk

    def _differentiable(self) -> set[Tensor]:
        found = {t for t in self.spec.arguments if t.dtype == "float"}
        for eq in self.spec.equations:
            if eq.tensor.dtype == "float" and not eq.tensor.whole and self.needs(eq.rhs, found):
                found.add(eq.tensor)
        return found

    def needs(self, node: Node, among: set[Tensor] | None = None) -> bool:
        """Whether a cotangent can reach a differentiable tensor through `node`."""
        among = self.differentiable if among is None else among
        if isinstance(node, Ref):
            return node.tensor in among
        if is_condition(node):
            return False
        if isinstance(node, Field):
            return bool(node.expr.free_symbols & self.symbols.keys())
        args = node.args[1:] if isinstance(node, Apply) and node.fn == "where" else children(node)
        return any(self.needs(a, among) for a in args)

    def run(self) -> Backward:
        for t in self.spec.outputs:
            if t in self.differentiable:
                name = self.fresh("d" + t.name)
                self.out.given.append(t)
                self.out.inputs.append(f"input {printer.ref(name, t.layout)}")
                free = frozenset(t.indices)
                self.parts.setdefault(t, []).append(
                    Part(self.own(t), Cot(printer.ref(name, t.layout), free, free))
                )
        for eq in reversed(self.spec.equations):
            if eq.tensor in self.parts:
                self.eq = eq
                cot = self.accumulate(eq.tensor)
                self.back(eq.rhs, cot)
        self.eq = None
        for t in self.spec.arguments:
            if t in self.parts:
                self.accumulate(t)
                self.out.reached.append(t)
                self.out.outputs.append(self.names[t])
        for scalar in self.spec.scalars:
            if scalar in self.scalar_parts:
                name = self.fresh("d" + scalar.name)
                self.out.equations.append(f"{name}_<> = {' + '.join(self.scalar_parts[scalar])}")
                self.out.scalars.append(scalar)
                self.out.outputs.append(name)
        if not self.out.outputs:
            raise SpecError(
                "no derived backward: no cotangent reaches an input, param or buffer",
                file=self.file,
                hint="every path from the outputs to the arguments goes through positions, "
                "comparisons, integer tensors or rounding, whose gradient is zero.",
            )
        return self.out

    def own(self, tensor: Tensor) -> Ref:
        """The tensor read with its own layout."""
        return Ref(tensor, tensor.layout, tensor.span)

    def back(self, node: Node, cot: Cot) -> None:
        if self.needs(node):
            getattr(self, "back_" + type(node).__name__.lower())(node, cot)

    def back_ref(self, node: Ref, cot: Cot) -> None:
        cot = restrict(cot, node.free)
        if self.precision() and not is_reference(cot.text):  # computed in it, then read
            cot = self.materialize(cot, "d" + node.tensor.name, node.free)
        self.parts.setdefault(node.tensor, []).append(Part(node, cot))

    def precision(self) -> str:
        """The precision of the equation being differentiated (`ρ_<μτ> : float32 = ...`):
        what its backward computes is declared in it too, as autograd differentiates the
        widened steps in their own dtype (differential's rsqrt slope overflows float16)."""
        return self.eq.tensor.precision if self.eq else ""

    def declared(self, name: str, axes) -> str:
        """A left side, with the precision of the equation being differentiated."""
        precision = self.precision()
        return printer.ref(name, axes) + (f" : {precision}" if precision else "")

    def back_field(self, node: Field, cot: Cot) -> None:
        """A field that reads a scalar sends the cotangent times its derivative in that
        scalar, summed over every index, to the scalar."""
        for symbol, scalar in self.symbols.items():
            slope = sympy.diff(node.expr, symbol)
            if slope != 0:
                free = frozenset(node.free)
                factor = Cot(f"({printer.field(slope)})", free, mentioned(node))
                self.scalar_parts.setdefault(scalar, []).append(
                    product([cot, factor], frozenset()).text
                )

    def back_sum(self, node: Sum, cot: Cot) -> None:
        for term in node.terms:
            self.back(term, restrict(cot, term.free))

    def back_product(self, node: Product, cot: Cot) -> None:
        for k, f in enumerate(node.factors):
            if self.needs(f):
                others = [self.value(g) for j, g in enumerate(node.factors) if j != k]
                self.back(f, self.into(f, product([cot, *others], frozenset(f.free))))

    def into(self, node: Node, cot: Cot) -> Cot:
        """A cotangent handed to `node`: named first unless `node` is a reference, so that
        no product is ever pasted into another (its sums would change)."""
        cot = restrict(cot, node.free)
        if isinstance(node, Ref) or is_reference(cot.text):
            return cot
        return self.materialize(cot, "d" + self.eq.tensor.name, node.free)

    def materialize(self, cot: Cot, base: str, order) -> Cot:
        name = self.fresh(base)
        axes = tuple((i,) for i in order if i in cot.free)
        self.out.equations.append(f"{self.declared(name, axes)} = {cot.text}")
        return Cot(printer.ref(name, axes), cot.free, cot.free, axes)

    def value(self, node: Node) -> Cot:
        """The forward value of a node as a factor: a reference where there is one."""
        free = frozenset(node.free)
        if node in self.defined:
            tensor = self.defined[node]
            return Cot(printer.ref(tensor.name, tensor.layout), free, free, tensor.layout)
        if isinstance(node, (Ref, Field)):
            ref = node if isinstance(node, Ref) else None
            return Cot(printer.factor(node, {}), free, mentioned(node), ref=ref)
        if node not in self.values:
            text = printer.text(unmasked(node, self.out.masks))
            base = self.eq.tensor.name + "_v"
            self.values[node] = self.materialize(Cot(text, free, mentioned(node)), base, node.free)
        return self.values[node]

    # -- functions

    def back_apply(self, node: Apply, cot: Cot) -> None:
        if node.fn == "where":
            condition = printer.text(node.args[0])
            # as the forward evaluates them (numerics.guarded): a branch that can overflow
            # reads a finite value where it is hidden, so its slope there is finite and the
            # zero cotangent gives zero, not 0 × inf = NaN (and a read kept inside its axis
            # by the where is differentiated where the forward reads it)
            branches = guarded(node).args[1:]
            for arg, form in zip(branches, ("where({0}, {1}, 0)", "where({0}, 0, {1})")):
                if not self.needs(arg):
                    continue
                text = form.format(condition, cot.text)
                mentions = cot.all | mentioned(node.args[0])
                free = cot.free | frozenset(node.args[0].free)
                self.back(arg, self.into(arg, Cot(text, free, mentions)))
            return
        if node.fn == "dropout":
            if self.training:
                mask = self.out.masks[id(node)]
                free = frozenset(mask.indices)
                cot = product([cot, Cot(printer.ref(mask.name, mask.layout), free, free)], free)
            self.back(node.args[0], self.into(node.args[0], cot))
            return
        rules = DERIVATIVES.get(node.fn)
        if rules is None:
            raise self.refuse(node.fn, node, "ops.DERIVATIVES has no rule for it.")
        for k, arg in enumerate(node.args):
            if rules[k] == "0" or not self.needs(arg):
                continue
            slope = self.slope(node, k)
            self.back(arg, self.into(arg, product([cot, slope], frozenset(arg.free))))

    def slope(self, node: Apply, k: int) -> Cot:
        """∂ fn / ∂ argument k, at the forward's arguments. Where the rule reads the function's
        own value (tanh's 1 - tanh(x)^2), that value is named once, as the forward's."""
        exponent = node.args[1] if node.fn == "pow" else None
        if k == 0 and isinstance(exponent, Field):
            values = [self.value(node.args[0])]
            text = power_slope(values[0].text, exponent.expr)
        else:
            rule, names = DERIVATIVES[node.fn][k], {}
            itself = f"{node.fn}({', '.join('xyz'[: len(node.args)])})"
            if itself in rule:
                names["@"] = self.value(node)
                rule = rule.replace(itself, "@")
            for name, arg in zip("xyz", node.args):
                if re.search(rf"\b{name}\b", rule):
                    names[name] = self.value(arg)
            text = re.sub(r"\b[xyz]\b|@", lambda m: names[m.group()].text, rule)
            values = list(names.values())
        free = frozenset(node.free)
        return Cot(f"({text})", free, frozenset().union(*(v.all for v in values)))

    # -- reductions

    def back_reduce(self, node: Reduce, cot: Cot) -> None:
        getattr(self, "reduce_" + node.fn)(node, cot)

    def reduce_sum(self, node: Reduce, cot: Cot) -> None:
        self.back(node.body, self.into(node.body, cot))

    def reduce_mean(self, node: Reduce, cot: Cot) -> None:
        count = sympy.Mul(*(i.size for i in node.over))
        scale = Cot(f"(1 / ({printer.field(count)}))", frozenset())
        self.reduce_sum(node, product([cot, scale], frozenset(node.free)))

    def reduce_softmax(self, node: Reduce, cot: Cot) -> None:
        over = "".join(i.glyph for i in node.over)
        a = self.value(node)
        cot = self.named(cot, node)
        rows = self.rewritten("rows", Cot(f"sum_<{over}>({a.text} {cot.text})", frozenset()), node)
        text = f"{a.text} ({cot.text} - {rows.text})"
        free = frozenset(node.free)
        self.back(node.body, self.into(node.body, Cot(text, free, free | a.all | rows.all)))

    def named(self, cot: Cot, node: Node) -> Cot:
        if is_reference(cot.text):
            return cot
        return self.materialize(cot, "d" + self.eq.tensor.name, node.free)

    def scaled(self, node: Node, cot: Cot, slope: str, mentions: frozenset[Index]) -> None:
        """The cotangent times the derivative `slope` (which carries node's indices), to
        `node`."""
        free = frozenset(node.free)
        self.back(node, self.into(node, product([cot, Cot(slope, free, mentions)], free)))

    def reduce_logsumexp(self, node: Reduce, cot: Cot) -> None:
        weights = self.value(Reduce("softmax", node.over, node.body, node.span))
        self.scaled(node.body, cot, weights.text, weights.all)

    def reduce_max(self, node: Reduce, cot: Cot) -> None:
        """The cotangent where the argument equals the result, split evenly among the tied
        entries (as autograd's amax and the literal interpreter split it)."""
        body, top = self.value(node.body), self.value(node)
        over = "".join(i.glyph for i in node.over)
        chosen = self.materialize(
            Cot(f"where({body.text} == {top.text}, 1, 0)", body.free, body.all | top.all),
            self.eq.tensor.name + "_tie",
            node.body.free,
        )
        share = f"({chosen.text} / sum_<{over}>({chosen.text}))"
        self.scaled(node.body, cot, share, chosen.all)

    reduce_min = reduce_max

    def reduce_cumsum(self, node: Reduce, cot: Cot) -> None:
        """The reverse running sum, Σ over j' ≥ j: the total, less the running sum, plus the
        term itself (or as a rewrite of BACKWARD_REWRITES writes it)."""
        g = self.named(cot, node)
        over = "".join(i.glyph for i in node.over)
        text = f"(sum_<{over}>({g.text}) - cumsum_<{over}>({g.text}) + {g.text})"
        plain = Cot(text, g.free, g.all)
        self.back(node.body, self.into(node.body, self.rewritten("running", plain, node, g)))

    def back_concat(self, node: Concat, cot: Cot) -> None:
        """Each part's cotangent is the whole's, read where the part was written: at
        [c] for the first, [N_c + τ] for the second."""
        if not cot.layout or node.over not in cot.free:
            cot = self.materialize(cot, "d" + self.eq.tensor.name, node.free)
        name, offset = cot.text.split("_<")[0], sympy.Integer(0)
        for part, along in zip(node.parts, node.along):
            start = f"{printer.field(offset)} + " if offset != 0 else ""
            slot = {node.over: f"[{start}{along.glyph}]"}
            written = ["".join(slot.get(i, i.glyph) for i in a) for a in cot.layout]
            axes = "".join(w if len(a) == 1 else f"({w})" for w, a in zip(written, cot.layout))
            free = (cot.free - {node.over}) | {along}
            self.back(part, self.into(part, Cot(f"{name}_<{axes}>", free, free)))
            offset += along.size

    # -- accumulation

    def accumulate(self, tensor: Tensor) -> Cot:
        """One equation for the cotangent of `tensor`: the sum of its parts; returns it read
        with the tensor's own layout."""
        parts = self.parts.pop(tensor)
        plain = next((p for p in parts if all(isinstance(i, Index) for i in p.ref.written)), None)
        glyphs = [i.glyph for i in (plain.ref.written if plain else tensor.indices)]
        name = self.names[tensor] = self.fresh("d" + tensor.name)  # before its parts' names
        grouped = self.rewritten("sums", tuple(parts), glyphs, tensor)
        terms = [self.term(p, glyphs, tensor) for p in grouped]
        axes, flat = [], iter(glyphs)
        for axis in tensor.layout:
            axes.append(tuple(next(flat) for _ in axis))
        lhs = "_<" + "".join(a[0] if len(a) == 1 else f"({''.join(a)})" for a in axes) + ">"
        free = frozenset(tensor.indices)
        if tensor.role == "derived" and len(terms) == 1 and terms[0].endswith(lhs):
            given = terms[0][: -len(lhs)]  # already a tensor of its own: the cotangent input
            if is_reference(terms[0]) and given in self.taken:
                self.taken.discard(name)
                self.names[tensor] = given
                return Cot(printer.ref(given, tensor.layout), free, free, tensor.layout)
        self.uncovered(tensor, parts, glyphs)
        self.out.equations.append(f"{name}{lhs} = {' + '.join(terms)}")
        return Cot(printer.ref(name, tensor.layout), free, free, tensor.layout)

    def uncovered(self, tensor: Tensor, parts: list[Part], glyphs: list[str]) -> None:
        """Every index of a cotangent must vary in some part (a cotangent constant along an
        index alone would need a tensor of ones, which the language has no name for)."""
        covered = set()
        for p in parts:
            for g, w in zip(glyphs, p.ref.written):
                if not isinstance(w, Index) or w in p.cot.free:
                    covered.add(g)
        for g in glyphs:
            if g not in covered:
                raise self.refuse(
                    f"the cotangent of {tensor.name}, constant along {g}",
                    parts[0].ref,
                    "a cotangent that only broadcasts along an index is not derived yet.",
                )

    def term(self, part: Part, glyphs: list[str], tensor: Tensor) -> str:
        written, cot = part.ref.written, part.cot
        slots = [(g, w) for g, w in zip(glyphs, written) if not isinstance(w, Index)]
        same = all(w.glyph == g for g, w in zip(glyphs, written) if isinstance(w, Index))
        if same and not slots:
            return cot.text
        mentioned_glyphs = {i.glyph for i in cot.all}
        if (
            same
            and not any(isinstance(w, At) for _, w in slots)
            and not any(g in mentioned_glyphs for g, _ in slots)
        ):
            condition = " and ".join(f"{g} == {w}" for g, w in slots)
            return f"where({condition}, {cot.text}, 0)"
        return self.scatter(part, glyphs, tensor)

    def scatter(self, part: Part, glyphs: list[str], tensor: Tensor) -> str:
        """A part whose reference selects a slice or reads computed positions: named, then
        placed by `where` on the index of the slot, summed over the positions' indices."""
        ref, cot = part.ref, part.cot
        order = [i for i in ref.free if i in cot.free]
        named = self.materialize(cot, "d" + tensor.name, order)
        rename: dict[Index, str] = {}
        for g, w in zip(glyphs, ref.written):
            if isinstance(w, Index):
                rename[w] = g
        fresh = []
        for w in ref.written:
            for i in w.free if isinstance(w, At) else ():
                if i not in rename:
                    rename[i] = self.fresh_index(i)
                    fresh.append(rename[i])
        conditions = []
        for g, w in zip(glyphs, ref.written):
            if isinstance(w, int):
                conditions.append(f"{g} == {w}")
            elif isinstance(w, At):
                conditions.append(f"{g} == {printer.factor(w.value, rename)}")
        name = named.text.split("_<")[0]
        text = printer.ref(name, tuple((i,) for i in order), rename)
        if conditions:
            text = f"where({' and '.join(conditions)}, {text}, 0)"
        return f"sum_<{''.join(fresh)}>({text})" if fresh else text


def restrict(cot: Cot, free) -> Cot:
    """The cotangent of a node that carries only `free`: summed over the rest."""
    extra = [i for i in cot.free if i not in set(free)]
    if not extra:
        return cot
    over = "".join(i.glyph for i in sorted(extra, key=lambda i: i.glyph))
    return Cot(f"sum_<{over}>({cot.text})", cot.free - set(extra), cot.all)


def product(parts: list[Cot], target: frozenset[Index]) -> Cot:
    """Factors multiplied and summed over every index not in `target`: Einstein sums those
    written twice; those written once are summed explicitly."""
    counts: dict[Index, int] = {}
    for p in parts:
        for i in p.free:
            counts[i] = counts.get(i, 0) + 1
    once = [i for i, n in counts.items() if n == 1 and i not in target]
    signs = [p for p in parts if p.text == "(-1)"]
    text = ("-" if len(signs) % 2 else "") + " ".join(p.text for p in parts if p not in signs)
    if once:
        text = f"sum_<{''.join(i.glyph for i in once)}>({text})"
    mentions = frozenset().union(*(p.all for p in parts))
    factors = tuple(parts) if not once and not signs else ()
    return Cot(text, frozenset(counts) & target, mentions, factors=factors)


def power_slope(base: str, exponent: sympy.Expr) -> str:
    """c x^(c - 1), the exponent worked out."""
    lower = sympy.simplify(exponent - 1)
    coefficient = printer.field(exponent)
    if lower == 0:
        return coefficient
    power = base if lower == 1 else f"{base}^({printer.field(lower)})"
    return f"({coefficient}) {power}" if exponent != 1 else power


def is_reference(text: str) -> bool:
    return re.fullmatch(r"[^\s()]+_<[^<>]*>", text) is not None


def reads(node: Node, tensor: Tensor) -> bool:
    if isinstance(node, Ref) and node.tensor == tensor:
        return True
    return any(reads(c, tensor) for c in children(node))


def mentioned(node: Node) -> frozenset[Index]:
    found: set[Index] = set(node.free)
    if isinstance(node, Reduce):
        found |= set(node.over)
    if isinstance(node, Product):
        found |= set(node.summed)
    for c in children(node):
        found |= mentioned(c)
    return frozenset(found)


def dropouts(spec: Spec) -> list[tuple[Equation, Apply]]:
    """The calls of dropout in the forward's order (the order a call draws their masks), each
    with its equation."""
    found = [(eq, n) for eq in spec.equations for n in walk(eq.rhs) if isinstance(n, Apply)]
    return [(eq, n) for eq, n in found if n.fn == "dropout"]


def unmasked(node: Node, masks: dict[int, Tensor]) -> Node:
    """The node with each dropout of `masks` written as its argument times its mask."""
    if isinstance(node, Apply) and id(node) in masks:
        mask = masks[id(node)]
        held = Ref(mask, mask.layout, node.span)
        return Product((unmasked(node.args[0], masks), held), (), node.span)
    if isinstance(node, Ref) or not children(node):
        return node
    inner = [unmasked(c, masks) for c in children(node)]
    if all(a is b for a, b in zip(inner, children(node))):
        return node
    name = next(
        f.name for f in fields(node) if f.name in ("factors", "terms", "args", "body", "parts")
    )
    return replace(node, **{name: inner[0] if name == "body" else tuple(inner)})
