"""The planner's fused kernels: one matrix product for all the slices of a weight, and the
attention core as one `F.scaled_dot_product_attention`, from the matches of `fusion`."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import sympy

from ... import ir
from ...ir import Index, Spec
from ..program.kinds import constant
from ..program.steps import Arg, Attention, Flex, Grid, Operand, Pad, Spans, Split, Step, Var
from .fusion import (
    AttentionMatch,
    LinearForm,
    ProjectionGroup,
    declared_outer,
    find_attention,
    kept_node,
    kept_tensor,
    projection_groups,
)


class Planner(Protocol):
    """What the kernels ask of the planner (plan.py's Planner, which holds them)."""

    order: tuple[Index, ...]
    steps: list[Step]
    held: dict[str, Operand]

    def var(self, hint: str) -> Var: ...
    def add(self, step: Step) -> Operand: ...
    def node(self, node: ir.Node, hint: str) -> Arg: ...
    def as_tensor(self, value: Arg, hint: str) -> Operand: ...
    def assign(self, eq: ir.Equation, value: Operand) -> None: ...
    def general(self, eq: ir.Equation, rhs: ir.Node) -> None: ...
    def linear(self, form: LinearForm, hint: str) -> Operand: ...


class Kernels:
    """Which equations a kernel computes, and the steps that compute them."""

    def __init__(self, planner: Planner, spec: Spec, backend: str = "auto") -> None:
        self.planner = planner
        self.attention: dict[str, list] = {}  # AttentionMatch (sdpa) or backends.flex.Core
        precise = {t.name for t in spec.tensors if t.precision}  # planned apart (plan.precise)
        for match in _cores(spec, backend):
            if precise.isdisjoint(e.tensor.name for e in (*match.chain, match.output)):
                self.attention.setdefault(match.output.tensor.name, []).append(match)
        self.groups = {
            g.equations[0].tensor.name: g
            for g in projection_groups(spec)
            if precise.isdisjoint(e.tensor.name for e in g.equations)
        }
        skip = {eq.tensor.name for ms in self.attention.values() for m in ms for eq in m.chain}
        skip |= {eq.tensor.name for g in self.groups.values() for eq in g.equations[1:]}
        self.skip = skip - set(self.attention)

    def skipped(self, eq: ir.Equation) -> bool:
        """Computed by a kernel planned with another equation."""
        return eq.tensor.name in self.skip

    def block(self, eq: ir.Equation) -> tuple[ir.Equation, ...] | None:
        """The equations a kernel computes from this one, planned; None where none does."""
        name = eq.tensor.name
        if name in self.groups:
            return self.projections(self.groups[name])
        if name not in self.attention:
            return None
        matches, planner = self.attention[name], self.planner
        if matches[0].whole:
            planner.order = eq.indices
            planner.assign(eq, self.call(matches[0], eq.tensor.ascii))
        else:
            rhs = eq.rhs
            for k, match in enumerate(matches):
                rhs = _substitute(rhs, match.node, self.held(match, eq, k))
            planner.general(eq, rhs)
        return (*dict.fromkeys(e for m in matches for e in m.chain), eq)

    def call(self, match, name: str) -> Operand:
        """The core's kernel: SDPA for a match of fusion's, flex_attention for a flex Core."""
        return (
            self.attend(match, name)
            if isinstance(match, AttentionMatch)
            else self.flex(match, name)
        )

    def held(self, match, eq: ir.Equation, k: int) -> ir.Ref:
        """The kernel's result for a core inside a longer right-hand side, planned now and
        held as a tensor of its own that the rest of the equation reads."""
        value = self.call(match, eq.tensor.ascii)
        layout = tuple((i,) for i in value.dims)
        name = f"{eq.tensor.name} core {k}"  # no spec's tensor is named with spaces
        tensor = ir.Tensor(name, value.var.hint, "derived", layout, value.batched)
        self.planner.held[name] = value
        return ir.Ref(tensor, layout, match.node.span)

    def linear_dims(self, form: LinearForm, x: Operand) -> tuple[Index, ...]:
        """x's other axes, then the weight's out block: without the literal it picks, with
        the index of the part it reads in the declared index's place."""
        rest = tuple(i for i in x.dims if i not in form.inner)
        outer = declared_outer(form)
        if form.literal is not None:
            return rest + outer[: form.literal] + outer[form.literal + 1 :]
        if form.part is not None:
            return rest + outer[: form.part] + (form.span()[0],) + outer[form.part + 1 :]
        return rest + outer

    def projections(self, group: ProjectionGroup) -> tuple[ir.Equation, ...]:
        """One matrix product for all slices of a weight, split into the group's tensors."""
        planner, eqs = self.planner, group.equations
        planner.order = eqs[0].indices
        first = group.forms[0]
        names = [eq.tensor.ascii for eq in eqs]
        joined = ("" if all(len(n) == 1 for n in names) else "_").join(names)
        fused = planner.linear(replace(first, outer=declared_outer(first)), joined)
        over = fused.dims[len(fused.dims) - len(first.outer) + first.sliced]
        # Split first, then view each slice in its own order: the gradients of the slices
        # then stack straight into the layout of the product (no copy in the backward).
        outs = []
        for eq, form in zip(eqs, group.forms):
            dims = self.linear_dims(form, planner.node(form.x, eq.tensor.ascii))
            hint = eq.tensor.ascii if dims == eq.indices else eq.tensor.ascii + "_proj"
            outs.append(Operand(planner.var(hint), dims, fused.batched))
        planner.steps.append(Split(tuple(outs), fused, over, group.parts))
        for eq, out in zip(eqs, outs):
            planner.assign(eq, out)
        return eqs

    def attend(self, match: AttentionMatch, name: str) -> Operand:
        planner = self.planner
        planner.order, scores = match.order, match.at.tensor.ascii
        q, k = (
            tuple(planner.as_tensor(planner.node(n, scores), scores) for n in parts)
            for parts in (match.q, match.k)
        )
        mask = self.mask(match, scores)
        planner.order = match.output.indices
        v = planner.as_tensor(planner.node(match.v, name), name)
        padded = self.padded(match, v)
        rename = dict(match.rename)
        heads = match.heads + match.groups
        out = (*(rename[i] for i in (*heads, match.query)), match.value_width)
        batched = any(a.batched for a in (*q, *k, v))
        return planner.add(
            Attention(
                Operand(planner.var(name + "_attn"), out, batched),
                q=q,
                k=k,
                v=padded,
                mask=mask,
                q_dims=(*heads, match.query),
                k_dims=(*match.heads, match.key),
                widths=match.widths,
                v_dims=(*(rename[i] for i in match.heads), rename[match.key], match.value_width),
                mask_dims=(*heads, match.query, match.key),
                heads=len(heads),
                kv_heads=len(match.heads),
                scale=match.scale,
                causal=match.causal,
                dropout=match.p,
                cut=padded is not v,
                spans=self.spans(match, mask),
            )
        )

    def flex(self, core, name: str) -> Operand:
        """The core as one `Flex` step: q, k and v planned as for SDPA, and the tensors its
        score and keep read, each in its declared indices."""
        planner, match = self.planner, core.match
        planner.order, scores = match.order, match.at.tensor.ascii
        q, k = (
            tuple(planner.as_tensor(planner.node(n, scores), scores) for n in parts)
            for parts in (match.q, match.k)
        )
        reads = []
        for tensor in core.tensors:
            own = tuple((i,) for axis in tensor.layout for i in axis)
            planner.order = tuple(i for (i,) in own)
            ref = ir.Ref(tensor, own, match.node.span)
            reads.append(planner.as_tensor(planner.node(ref, tensor.ascii), tensor.ascii))
        planner.order = match.output.indices
        v = planner.as_tensor(planner.node(match.v, name), name)
        rename = dict(match.rename)
        heads = match.heads + match.groups
        out = (*(rename[i] for i in (*heads, match.query)), match.value_width)
        batched = any(a.batched for a in (*q, *k, v))
        return planner.add(
            Flex(
                Operand(planner.var(name + "_attn"), out, batched),
                q=q,
                k=k,
                v=v,
                reads=tuple(reads),
                q_dims=(*heads, match.query),
                k_dims=(*match.heads, match.key),
                widths=match.widths,
                v_dims=(*(rename[i] for i in match.heads), rename[match.key], match.value_width),
                heads=len(heads),
                kv_heads=len(match.heads),
                scale=match.scale,
                score=core.score,
                keep=core.keep,
                tensors=core.tensors,
                dropout=match.p,
            )
        )

    def spans(self, match: AttentionMatch, mask: Operand | None) -> Operand | None:
        """Blocks of queries over the keys each sees, where the mask may hide whole blocks of
        keys: a boolean mask, or a float one built once per shape (scanning a per-call float
        bias, which hides nothing, would cost a pass over it on every call). The mask must end
        in (query, key), so that a block is a slice of it."""
        if mask is None or mask.dims[-2:] != (match.query, match.key):
            return None
        hides = "false" if match.keep is not None else "-inf"
        if hides == "-inf" and mask.var not in constant(self.planner.planned):
            return None
        out = Operand(self.planner.var(mask.var.hint + "_spans"), (), False)
        return self.planner.add(Spans(out, mask, hides))

    def padded(self, match: AttentionMatch, v: Operand) -> Operand:
        """The values with zero features up to the width of the queries and keys, where they
        may be narrower: CPU's fused kernel wants the three as wide, else the call builds the
        scores. Only with is_causal, where it was measured to pay; never the queries and keys,
        which would add to the score products (docs/decisions.md, "Values narrower than the
        queries and keys"). The zeros only make output features that are cut off."""
        width = sum(sympy.Mul(*(i.size for i in w)) for w in match.widths)
        over = match.value_width
        if not match.causal or over not in v.dims or (width - over.size).is_nonpositive:
            return v
        out = Operand(self.planner.var(v.var.hint + "_pad"), v.dims, v.batched)
        return self.planner.add(Pad(out, v, over, width))

    def mask(self, match: AttentionMatch, scores: str) -> Operand | None:
        """None for is_causal; a boolean grid for predicates; else the terms, summed."""
        planner = self.planner
        if match.causal or not match.terms:
            return None
        named = match.masks and not match.booleans  # else its parts take the mask's name
        base = match.masks[0].tensor.ascii + "_keep" if named else scores + "_keep"
        if isinstance(match.keep, ir.Node):  # it reads tensors: built on every call
            self.booleans(match)
            return planner.as_tensor(planner.node(match.keep, base), base)
        if match.keep is not None:
            free = match.keep.free_symbols
            dims = tuple(i for i in planner.order if i.symbol in free)
            return planner.add(Grid(Operand(planner.var(base), dims, False), match.keep))
        terms = match.terms
        node = terms[0] if len(terms) == 1 else ir.Sum(terms, terms[0].span)
        return planner.as_tensor(planner.node(node, scores + "_bias"), scores + "_bias")

    def booleans(self, match: AttentionMatch) -> None:
        """Each mask the keep reads at computed positions, made as its keep: a boolean
        tensor, in the mask's indices, that the keep's reference reads (held by its name)."""
        planner, order = self.planner, self.planner.order
        for eq in match.booleans:
            tensor = kept_tensor(eq)
            planner.order = eq.indices
            value = planner.node(kept_node(eq), tensor.ascii)
            planner.held[tensor.name] = planner.as_tensor(value, tensor.ascii)
        planner.order = order


def _cores(spec: Spec, backend: str) -> tuple:
    """The cores the backend named computes: SDPA's matches for "auto" (the rest planned as
    general steps, by blocks) and "sdpa", none for "blocks", FlexAttention's for "flex",
    auto's for "triton" (whose calls run its kernels: runtime/compiled.py); a backend asked
    for by name that cannot take a core is refused (ValueError, the reason)."""
    from ... import backends
    from ...backends import flex
    from ...backends.flex import core as flex_core

    if backend == "blocks":
        return ()
    if backend == "flex":
        return _taken(flex, flex_core.cores, flex_core.Refused, spec)
    if backend == "triton":  # the generated module is auto's; calls run the kernels
        from ...backends.triton import core as triton_core

        read = backends.triton.reads
        _taken(backends.triton, lambda s: (read(s),), triton_core.Refused, spec)
    matches = find_attention(spec)
    if backend == "sdpa":
        matched = {m.output.tensor.name for m in matches}
        try:
            seen = flex_core.cores(spec)
        except flex_core.Refused as error:
            seen = () if matches else error
        if isinstance(seen, Exception):
            raise backends.refused(backend, spec.name, str(seen))
        for core in seen:
            if core.match.output.tensor.name not in matched:
                why = backends.sdpa.takes(core)
                raise backends.refused(backend, spec.name, f"{why} ({_changes(core)})")
    return matches


def _taken(backend, read, refusal: type[Exception], spec: Spec) -> tuple:
    """The cores `read(spec)` finds, each taken by the backend module; else refused by name
    with the reason (the reader's `refusal`, or the backend's `takes`)."""
    from ... import backends

    try:
        found = read(spec)
    except refusal as error:
        raise backends.refused(backend.NAME, spec.name, str(error)) from None
    for core in found:
        why = backend.takes(core)
        if why is not None:
            raise backends.refused(backend.NAME, spec.name, why)
    return found


def _changes(core) -> str:
    return f"the scores of {core.match.output.tensor.name} are {core.score}"


def _substitute(node: ir.Node, core: ir.Product, ref: ir.Ref) -> ir.Node:
    """`node` with the core read as `ref`: the core itself, a term of a sum, or two factors
    of a longer product (the sum over the key goes with them)."""
    if node is core:
        return ref
    if isinstance(node, ir.Sum):
        return replace(node, terms=tuple(_substitute(t, core, ref) for t in node.terms))
    if not isinstance(node, ir.Product):
        return node
    picked = [k for k, f in enumerate(node.factors) if any(f is c for c in core.factors)]
    if len(picked) != 2:
        return node
    first, second = picked
    factors = tuple(ref if k == first else f for k, f in enumerate(node.factors) if k != second)
    summed = tuple(i for i in node.summed if i not in core.summed)
    return replace(node, factors=factors, summed=summed)
