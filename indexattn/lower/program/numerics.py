"""The numerics policy in one place: which values are *tables* (made from positions, sizes,
scalars and integer inputs alone, never from the call's float data), what dtype they are
computed in, and where they meet the call's dtype.

- Positions are whole numbers: exact (float64 up to 2^53, int64 when they index).
- Tables (rotary angles and their cos and sin, ALiBi slopes times distances, masks) are
  computed in `TABLE`: float32 for a float32, float16 or bfloat16 call, float64 for a float64
  call, as transformers builds its rotary tables in float32.
- A table is cast to the call's dtype where it is made, when data reads it or it is returned
  (`cos_theta = torch.cos(theta).to(dtype)`); a table read only by other tables stays wide.
- Everything else runs in the call's dtype, with torch's own accumulation (softmax and
  reductions of float16 and bfloat16 accumulate in float32 inside torch's kernels), except a
  tensor declared with a precision (`A_<ττ'> : float32 = ...`): what its equation reads is
  cast up (`widened`), its steps run in that precision, and it is held so; an equation in the
  call's dtype reads it cast down (plan.py, `Planner.narrowed`).
- In `where(c, a, b)`, a function of a branch that can overflow or leave its domain reads a
  finite value where that branch is not chosen (`guarded`): gradients stay finite.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy

from ... import ops
from ...ir import CONDITIONS
from .kinds import makes_floats, pure, reads
from .program import Program
from .steps import (
    Choose,
    Elementwise,
    Flip,
    Full,
    Gather,
    Grid,
    Rename,
    Slice,
    Spans,
    Step,
    Unfuse,
    Var,
    Whole,
)

# The dtype tables are built in, from the call's `dtype`: float32 at least.
TABLE = "torch.promote_types(dtype, torch.float32)"


@dataclass(frozen=True)
class Tables:
    """The plan's tables, and those cast to the call's dtype where made."""

    values: frozenset[Var]
    cast: frozenset[Var]


def tables(plan: Program) -> Tables:
    """`tables(plan).cast`: the float tables data reads (or the call returns)."""
    kinds: dict[Var, str] = {
        Var(-1, t.ascii, argument=True): "int" for t in plan.spec.arguments if t.dtype == "int"
    }
    readers: dict[Var, bool] = {}  # table -> read by data (or returned)
    for step in plan.steps:
        read = [o.var for o in reads(step)]
        if _table_step(step) and all(v in kinds for v in read):
            kinds[step.out.var] = _kind(step, kinds)
            continue
        if not _widens(step):  # a table read in a precision of its own stays wide
            readers.update({v: True for v in read if v in kinds})
    readers.update({r.var: True for r in plan.results if r.var in kinds})
    made = frozenset(v for v in kinds if not v.argument)
    cast = frozenset(v for v in made if kinds[v] == "float" and readers.get(v))
    return Tables(made, cast)


def _widens(step: Step) -> bool:
    return isinstance(step, Elementwise) and step.fn in ("float32", "float64")


def _table_step(step: Step) -> bool:
    if isinstance(step, Elementwise) and ops.lookup(step.fn).kind == "cast":
        return False
    if isinstance(step, Unfuse):
        return step.tensor.dtype == "int"
    if isinstance(step, Elementwise) and step.fn == "dropout":
        return False
    return pure(step) and not isinstance(step, Spans)


def _kind(step: Step, kinds: dict[Var, str]) -> str:
    """ "bool", "int" or "float": what a table step makes of what it reads."""
    if isinstance(step, Grid):
        return "int" if step.index else "bool" if isinstance(step.expr, CONDITIONS) else "float"
    if isinstance(step, (Whole, Unfuse)):
        return "int"
    if isinstance(step, Full):
        return "float"
    if isinstance(step, Choose):
        inner = dict(kinds)
        for s in step.branches[0]:
            inner[s.out.var] = _kind(s, inner)
        return inner[step.branches[0][-1].out.var]
    if isinstance(step, (Gather, Flip, Slice, Rename)):
        return kinds[step.arg.var]
    if isinstance(step, Elementwise) and ops.lookup(step.fn).condition:
        return "bool"
    read = [kinds[o.var] for o in reads(step)]
    return "float" if "float" in read or makes_floats(step) else "int"


def cast(values, step: Step) -> list[str]:
    """The line that casts a table to the call's dtype where data first reads it."""
    out = getattr(step, "out", None)
    if out is None or out.var not in values.cast:
        return []
    values.needs.dtype = True
    name = values.var(out)
    return [f"{name} = {name}.to(dtype)  # a table, made in float32 or wider, cast for data"]


def may_be_neginf(node, masked: dict[str, bool], scalars: frozenset) -> bool:
    """Whether a value can hold -inf, decided by what its values can be, not by how the spec
    spells them: an infinity written, a scalar (a caller may pass -inf), a float argument (an
    input, param or buffer may hold -inf), a function that makes -inf of finite numbers (log 0,
    a quotient by 0), or a tensor defined from any of these. A product that sums over arguments
    is not: a contraction of an -inf gives -inf or NaN by itself, never a row the softmax
    should zero (only added masks hide keys)."""
    from ... import ir

    def can(n) -> bool:
        if isinstance(n, ir.Field):
            return bool(n.expr.has(sympy.oo, -sympy.oo) or n.expr.free_symbols & scalars)
        if isinstance(n, ir.Ref):
            return masked.get(n.tensor.name, False)
        if isinstance(n, ir.Product) and n.summed:
            return any(can(f) for f in n.factors if not _argument(f))
        if isinstance(n, ir.Apply):
            op = ops.lookup(n.fn)
            if op.condition:
                return False
            values = n.args[1:] if n.fn == "where" else n.args[:1] if n.fn == "dropout" else n.args
            return op.partial or any(can(a) for a in values)
        return any(can(child) for child in ir.children(n))

    return can(node)


def maskable(tensor) -> bool:
    """A declared tensor that may hold -inf: every float one."""
    return tensor.role != "derived" and tensor.dtype != "int"


def _argument(node) -> bool:
    from ... import ir

    return isinstance(node, ir.Ref) and node.tensor.role in ("input", "buffer", "param")


def widened(node, precision: str):
    """The right-hand side of `A : float32 = ...` with every float tensor it reads cast up
    (`float32`: to float32 or the call's dtype where wider; `float64`): its steps then run in
    that precision. Positions and integer tensors stay as they are."""
    from ... import ir

    if isinstance(node, ir.Ref):
        whole = node.tensor.dtype == "int" or node.tensor.whole
        return node if whole else ir.Apply(precision, (node,), node.span)
    if isinstance(node, ir.Product):
        return replace(node, factors=tuple(widened(f, precision) for f in node.factors))
    if isinstance(node, ir.Sum):
        return replace(node, terms=tuple(widened(t, precision) for t in node.terms))
    if isinstance(node, ir.Apply):
        return replace(node, args=tuple(widened(a, precision) for a in node.args))
    if isinstance(node, ir.Reduce):
        return replace(node, body=widened(node.body, precision))
    if isinstance(node, ir.Concat):
        return replace(node, parts=tuple(widened(p, precision) for p in node.parts))
    return node


# The value each argument of a function that can overflow or leave its domain takes where a
# `where` does not choose it: finite, with a finite derivative (exp(0), log(1), 1^0).
SAFE: dict[str, tuple] = {
    "exp": (0,),
    "expm1": (0,),
    "log": (1,),
    "log1p": (0,),
    "sqrt": (1,),
    "rsqrt": (1,),
    "pow": (1, 0),
    "mod": (0, 1),
}


def guarded(node):
    """`where(c, a, b)` with each function in a and b that can overflow (exp) or leave its
    domain (log, a power, a quotient) evaluated only where chosen: its data arguments read
    as a finite value elsewhere, `exp(where(c, 0, x))`. The values are those written; the
    gradient is where's own, not 0 times an infinity of a branch nobody chose (NaN: RetNet's
    decay `where(τ' > τ, 0, exp((τ - τ') λ))` overflows above the diagonal in float32)."""
    from ... import ir

    if not isinstance(node, ir.Apply) or node.fn != "where":
        return node
    cond, a, b = node.args
    return replace(node, args=(cond, _masked(a, cond, True), _masked(b, cond, False)))


def _kept_inside(ref, cond):
    """A read at computed positions that the condition keeps inside their axes (`where(τ >= p,
    S_<[τ - p]>, 0)`: zero padding) read at position 0 where the condition is false, so that
    the read not chosen reads no position outside its axis."""
    from ... import ir

    if not isinstance(cond, ir.Field):
        return ref
    declared = iter(ref.tensor.indices)
    axes = []
    for axis in ref.axes:
        items = [(i, next(declared)) for i in axis]
        axes.append(tuple(_inside(i, cond.expr, d) for i, d in items))
    return replace(ref, axes=tuple(axes)) if tuple(axes) != ref.axes else ref


def _inside(item, condition, declared):
    from ... import ir
    from ...ir.boxes import bounding

    if not (isinstance(item, ir.At) and isinstance(item.value, ir.Field) and item.free):
        return item
    said = bounding(condition, item.value.expr, declared.size)
    if not said:
        return item
    guarded = sympy.Piecewise((item.value.expr, sympy.And(*said)), (0, True))
    return replace(item, value=replace(item.value, expr=guarded))


def _masked(node, cond, chosen: bool):
    """`node` with the risky functions' arguments replaced by SAFE values where `cond` is
    not `chosen`; an argument without all of the condition's indices is left (masking it
    would widen it)."""
    from ... import ir

    if isinstance(node, ir.Ref) and chosen:
        return _kept_inside(node, cond)
    if isinstance(node, (ir.Product, ir.Sum)):
        field = "factors" if isinstance(node, ir.Product) else "terms"
        inner = tuple(_masked(c, cond, chosen) for c in ir.children(node))
        same = all(a is b for a, b in zip(inner, ir.children(node)))
        return node if same else replace(node, **{field: inner})
    if not isinstance(node, ir.Apply):
        return node
    args = tuple(_masked(a, cond, chosen) for a in node.args)
    if not SAFE.get(node.fn) and all(a is b for a, b in zip(args, node.args)):
        return node  # unchanged: the same node (a dropout is known by its identity)
    for k, safe in enumerate(SAFE.get(node.fn, ())):
        arg = args[k]
        if isinstance(arg, ir.Field) or not set(cond.free) <= set(arg.free):
            continue
        value = ir.Field(sympy.Integer(safe), (), arg.span)
        pair = (arg, value) if chosen else (value, arg)
        args = (*args[:k], ir.Apply("where", (cond, *pair), arg.span), *args[k + 1 :])
    return replace(node, args=args)
