"""Reverse mode over the IR: each equation, last to first, sends its left side's cotangent to
what its right side reads, as IR nodes. A contraction's cotangent is the other factors times
the cotangent, its indices renamed, never transposed; the cotangents of one tensor are summed
in one equation (derive/accumulate.py); a literal slice or a computed position is scattered
back by `where` on the index it selects; a where's branches are differentiated as the forward
evaluates them; an operator's slope is its rule in ops.DERIVATIVES (derive/rules.py). This
alone is correct; the rewrites of derive/rewrites.py then write some steps otherwise. The
backward is text only when derive/__init__.py prints it."""

from __future__ import annotations

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
    walk,
)
from ..lower.numerics import guarded
from ..notation.names import ascii_name, fresh
from ..ops import DERIVATIVES
from . import accumulate, rules
from .cotangents import (
    MINUS,
    ZERO,
    Cot,
    Line,
    Part,
    is_reference,
    mentioned,
    negated,
    product,
    restrict,
    where,
)


@dataclass
class Backward:
    """What the derivation writes, as IR: new indices, cotangent inputs, equations, outputs."""

    indices: list[Index] = field(default_factory=list)
    inputs: list[Tensor] = field(default_factory=list)
    equations: list[Line] = field(default_factory=list)
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
        self.scalar_parts: dict[Scalar, list[Node]] = {}
        self.out = Backward()
        self.taken = {t.name for t in spec.tensors} | {s.name for s in spec.scalars}
        self.taken |= {str(s) for s in spec.sizes} | {i.glyph for i in spec.indices}
        self.parts: dict[Tensor, list[Part]] = {}
        self.differentiable = self._differentiable()
        self.eq: Equation | None = None
        self.names: dict[Tensor, Tensor] = {}  # each tensor's cotangent, once accumulated
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

    def fresh_index(self, index: Index) -> Index:
        """A new index over `index`'s range, written with primes: `τ''`."""
        glyph = index.glyph + "'"
        while glyph in self.taken:
            glyph += "'"
        self.taken.add(glyph)
        symbol = sympy.Symbol(glyph, integer=True, nonnegative=True)
        made = Index(glyph, ascii_name(glyph), index.size, symbol=symbol)
        self.out.indices.append(made)
        return made

    def tensor(self, name: str, axes, role: str = "derived") -> Tensor:
        """A tensor of the backward's own (a cotangent, a value named once)."""
        return Tensor(name, ascii_name(name), role, tuple(axes), True)

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
                self.given(t)
        for eq in reversed(self.spec.equations):
            if eq.tensor in self.parts:
                self.eq = eq
                cot = accumulate.accumulate(self, eq.tensor)
                self.back(eq.rhs, cot)
        self.eq = None
        for t in self.spec.arguments:
            if t in self.parts:
                accumulate.accumulate(self, t)
                self.out.reached.append(t)
                self.out.outputs.append(self.names[t].name)
        for scalar in self.spec.scalars:
            if scalar in self.scalar_parts:
                self.scalar(scalar)
        if not self.out.outputs:
            raise SpecError(
                "no derived backward: no cotangent reaches an input, param or buffer",
                file=self.file,
                hint="every path from the outputs to the arguments goes through positions, "
                "comparisons, integer tensors or rounding, whose gradient is zero.",
            )
        return self.out

    def given(self, output: Tensor) -> None:
        """The output's cotangent, an input of the backward."""
        given = self.tensor(self.fresh("d" + output.name), output.layout, "input")
        self.out.given.append(output)
        self.out.inputs.append(given)
        free = frozenset(output.indices)
        cot = Cot(Ref(given, given.layout, None), free, free)
        self.parts.setdefault(output, []).append(Part(self.own(output), cot))

    def scalar(self, scalar: Scalar) -> None:
        """The scalar's cotangent: the sum of what each field that reads it sends."""
        name = self.tensor(self.fresh("d" + scalar.name), ())
        terms = self.scalar_parts[scalar]
        value = terms[0] if len(terms) == 1 else Sum(tuple(terms), None)
        self.out.equations.append(Line(Ref(name, (), None), value))
        self.out.scalars.append(scalar)
        self.out.outputs.append(name.name)

    def own(self, tensor: Tensor) -> Ref:
        """The tensor read with its own layout."""
        return Ref(tensor, tensor.layout, tensor.span)

    def back(self, node: Node, cot: Cot) -> None:
        if self.needs(node):
            getattr(self, "back_" + type(node).__name__.lower())(node, cot)

    def back_ref(self, node: Ref, cot: Cot) -> None:
        cot = restrict(cot, node.free)
        if self.precision() and not is_reference(cot.node):  # computed in it, then read
            cot = self.materialize(cot, "d" + node.tensor.name, node.free)
        self.parts.setdefault(node.tensor, []).append(Part(node, cot))

    def precision(self) -> str:
        """The precision of the equation being differentiated (`ρ_<μτ> : float32 = ...`):
        what its backward computes is declared in it too, as autograd differentiates the
        widened steps in their own dtype (differential's rsqrt slope overflows float16)."""
        return self.eq.tensor.precision if self.eq else ""

    def back_field(self, node: Field, cot: Cot) -> None:
        """A field that reads a scalar sends the cotangent times its derivative in that
        scalar, summed over every index, to the scalar."""
        for symbol, scalar in self.symbols.items():
            slope = sympy.diff(node.expr, symbol)
            if slope != 0:
                free = frozenset(node.free)
                factor = Cot(Field(slope, node.free, node.span), free, mentioned(node))
                self.scalar_parts.setdefault(scalar, []).append(
                    product([cot, factor], frozenset()).node
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
        if isinstance(node, Ref) or is_reference(cot.node):
            return cot
        return self.materialize(cot, "d" + self.eq.tensor.name, node.free)

    def materialize(self, cot: Cot, base: str, order) -> Cot:
        """The cotangent (or value) as an equation of its own, computed in the precision of
        the equation being differentiated; read by name."""
        axes = tuple((i,) for i in order if i in cot.free)
        target = Ref(self.tensor(self.fresh(base), axes), axes, None)
        self.out.equations.append(Line(target, cot.node, self.precision()))
        return Cot(target, cot.free, cot.free)

    def value(self, node: Node) -> Cot:
        """The forward value of a node as a factor: a reference where there is one."""
        free = frozenset(node.free)
        if node in self.defined:
            tensor = self.defined[node]
            return Cot(Ref(tensor, tensor.layout, None), free, free)
        if isinstance(node, (Ref, Field)):
            ref = node if isinstance(node, Ref) else None
            return Cot(node, free, mentioned(node), ref=ref)
        if node not in self.values:
            plain = Cot(unmasked(node, self.out.masks), free, mentioned(node))
            self.values[node] = self.materialize(plain, self.eq.tensor.name + "_v", node.free)
        return self.values[node]

    # -- functions

    def back_apply(self, node: Apply, cot: Cot) -> None:
        if node.fn in ("where", "dropout"):
            getattr(self, "apply_" + node.fn)(node, cot)
            return
        if DERIVATIVES.get(node.fn) is None:
            raise self.refuse(node.fn, node, "ops.DERIVATIVES has no rule for it.")
        for k, arg in enumerate(node.args):
            if DERIVATIVES[node.fn][k] == "0" or not self.needs(arg):
                continue
            self.back(arg, self.into(arg, product([cot, self.slope(node, k)], frozenset(arg.free))))

    def apply_where(self, node: Apply, cot: Cot) -> None:
        """Each branch gets the cotangent where it is chosen, as the forward evaluates it
        (numerics.guarded): a branch that can overflow reads a finite value where it is
        hidden, so its slope there is finite and the zero cotangent gives zero, not
        0 × inf = NaN (and a read kept inside its axis by the where is differentiated where
        the forward reads it)."""
        condition = node.args[0]
        branches = guarded(node).args[1:]
        mentions = cot.all | mentioned(condition)
        free = cot.free | frozenset(condition.free)
        for k, arg in enumerate(branches):
            if self.needs(arg):
                chosen = (cot.node, ZERO) if k == 0 else (ZERO, cot.node)
                self.back(arg, self.into(arg, Cot(where(condition, *chosen), free, mentions)))

    def apply_dropout(self, node: Apply, cot: Cot) -> None:
        """The cotangent times the mask the forward drew (in training)."""
        if self.training:
            mask = self.out.masks[id(node)]
            free = frozenset(mask.indices)
            cot = product([cot, Cot(Ref(mask, mask.layout, None), free, free)], free)
        self.back(node.args[0], self.into(node.args[0], cot))

    def slope(self, node: Apply, k: int) -> Cot:
        """∂ fn / ∂ argument k, at the forward's arguments, by the rule of ops.DERIVATIVES.
        Where the rule reads the function's own value (tanh's 1 - tanh(x)^2), that value is
        named once, as the forward's."""
        read: list[Cot] = []

        def value(of: Node) -> Node:
            read.append(self.value(of))
            return read[-1].node

        slope = rules.slope(node, k, value)
        return Cot(slope, frozenset(node.free), frozenset().union(*(v.all for v in read)))

    # -- reductions

    def back_reduce(self, node: Reduce, cot: Cot) -> None:
        getattr(self, "reduce_" + node.fn)(node, cot)

    def reduce_sum(self, node: Reduce, cot: Cot) -> None:
        self.back(node.body, self.into(node.body, cot))

    def reduce_mean(self, node: Reduce, cot: Cot) -> None:
        count = sympy.Mul(*(i.size for i in node.over))
        scale = Cot(Field(1 / count, (), None), frozenset())
        self.reduce_sum(node, product([cot, scale], frozenset(node.free)))

    def reduce_softmax(self, node: Reduce, cot: Cot) -> None:
        """A (g - Σ_j A g), the row sum as a rewrite may write it."""
        a = self.value(node)
        cot = self.named(cot, node)
        rows = Reduce("sum", node.over, Product((a.node, cot.node), (), None), None)
        rows = self.rewritten("rows", Cot(rows, frozenset()), node)
        g = Sum((cot.node, negated(rows.node)), None)
        free = frozenset(node.free)
        slope = Cot(Product((a.node, g), (), None), free, free | a.all | rows.all)
        self.back(node.body, self.into(node.body, slope))

    def named(self, cot: Cot, node: Node) -> Cot:
        if is_reference(cot.node):
            return cot
        return self.materialize(cot, "d" + self.eq.tensor.name, node.free)

    def scaled(self, node: Node, cot: Cot, slope: Cot) -> None:
        """The cotangent times the derivative `slope` (which carries node's indices), to
        `node`."""
        free = frozenset(node.free)
        slope = Cot(slope.node, free, slope.all)
        self.back(node, self.into(node, product([cot, slope], free)))

    def reduce_logsumexp(self, node: Reduce, cot: Cot) -> None:
        weights = self.value(Reduce("softmax", node.over, node.body, node.span))
        self.scaled(node.body, cot, weights)

    def reduce_max(self, node: Reduce, cot: Cot) -> None:
        """The cotangent where the argument equals the result, split evenly among the tied
        entries (as autograd's amax and the literal interpreter split it)."""
        body, top = self.value(node.body), self.value(node)
        tie = where(
            Apply("==", (body.node, top.node), None), Field(sympy.Integer(1), (), None), ZERO
        )
        chosen = self.materialize(
            Cot(tie, body.free, body.all | top.all), self.eq.tensor.name + "_tie", node.body.free
        )
        count = Apply("pow", (Reduce("sum", node.over, chosen.node, None), MINUS), None)
        share = Cot(Product((chosen.node, count), (), None), frozenset(), chosen.all)
        self.scaled(node.body, cot, share)

    reduce_min = reduce_max

    def reduce_cumsum(self, node: Reduce, cot: Cot) -> None:
        """The reverse running sum, Σ over j' ≥ j: the total, less the running sum, plus the
        term itself (or as a rewrite of BACKWARD_REWRITES writes it)."""
        g = self.named(cot, node)
        total = Reduce("sum", node.over, g.node, None)
        running = negated(Reduce("cumsum", node.over, g.node, None))
        plain = Cot(Sum((total, running, g.node), None), g.free, g.all)
        self.back(node.body, self.into(node.body, self.rewritten("running", plain, node, g)))

    def back_concat(self, node: Concat, cot: Cot) -> None:
        """Each part's cotangent is the whole's, read where the part was written: at
        [c] for the first, [N_c + τ] for the second."""
        if not cot.layout or node.over not in cot.free:
            cot = self.materialize(cot, "d" + self.eq.tensor.name, node.free)
        offset = sympy.Integer(0)
        for part, along in zip(node.parts, node.along):
            slot = At(Field(offset + along.symbol, (along,), None), None)
            axes = tuple(tuple(slot if i == node.over else i for i in a) for a in cot.layout)
            free = (cot.free - {node.over}) | {along}
            self.back(part, self.into(part, Cot(Ref(cot.node.tensor, axes, None), free, free)))
            offset += along.size


def reads(node: Node, tensor: Tensor) -> bool:
    if isinstance(node, Ref) and node.tensor == tensor:
        return True
    return any(reads(c, tensor) for c in children(node))


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
