"""Reverse mode over the IR: each equation, last to first, sends its left side's cotangent to
what its right side reads, as IR nodes (each node kind's rule: derive/adjoints.py). A
contraction's cotangent is the other factors times the cotangent, its indices renamed, never
transposed; the cotangents of one tensor are summed in one equation (derive/accumulate.py); a
literal slice or a computed position is scattered back by `where` on the index it selects; a
where's branches are differentiated as the forward evaluates them; an operator's slope is its
rule in ops.DERIVATIVES (derive/rules.py). This alone is correct; the rewrites of
derive/rewrites.py then write some steps otherwise. The backward is text only when
derive/__init__.py prints it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import sympy

from ..errors import SpecError
from ..ir import (
    Apply,
    Equation,
    Field,
    Index,
    Node,
    Product,
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
from ..notation.names import ascii_name, fresh
from . import accumulate, adjoints
from .cotangents import (
    Cot,
    Line,
    Part,
    is_reference,
    mentioned,
    restrict,
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
            adjoints.BACK[type(node)](self, node, cot)

    def precision(self) -> str:
        """The precision of the equation being differentiated (`ρ_<μτ> : float32 = ...`):
        what its backward computes is declared in it too, as autograd differentiates the
        widened steps in their own dtype (differential's rsqrt slope overflows float16)."""
        return self.eq.tensor.precision if self.eq else ""

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

    def named(self, cot: Cot, node: Node) -> Cot:
        """The cotangent as a reference: itself if it is one, else named."""
        if is_reference(cot.node):
            return cot
        return self.materialize(cot, "d" + self.eq.tensor.name, node.free)


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
