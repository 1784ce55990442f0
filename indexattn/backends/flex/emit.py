"""A `Flex` step (lower/steps.py) -> Python: the score_mod, mask_mod and block test as functions
of the module (mods.py), bound to the tensors, sizes and scalars they read, and the call of
backends/flex/run.py; q, k and v viewed (…, heads, sequence, width) as for SDPA."""

from __future__ import annotations

from ...lower.printers.values import relayout
from ...lower.program.steps import SCORE, Flex
from . import mods

RUN = "indexattn_flex"  # the generated module's name of run.py (reserved: notation/names.py)


def lines(em, step: Flex) -> list[str]:
    em.use("torch", RUN)
    out = em.var(step.out)
    q = em.features(step.q, step.q_dims, step.widths, step.heads)
    k = em.features(step.k, step.k_dims, step.widths, step.kv_heads)
    v = em.heads(step.v, step.v_dims, step.kv_heads)
    values = _values(em, step)
    args = [q, k, v, f"scale={em.number(step.scale)}"]
    made = []
    if step.score != SCORE:
        args.append(f"score_mod={_bound(em, step, mods.score_mod, out + '_score', values)}")
    if step.keep is not None:
        mask = _bound(em, step, mods.mask_mod, out + "_mask", values)
        box = _box(em, step, out + "_box", values)
        name = em.names.fresh(out + "_blocks")
        made.append(f"{name} = {_block_mask(em, step, mask, box, values)}")
        args.append(f"block_mask={name}")
    if step.grouped:
        args.append("enable_gqa=True")
    if step.dropout is not None:
        args += [f"dropout={em.number(step.dropout)}", "training=training"]
    why = "# the attention core by FlexAttention (backend='flex', indexattn/backends/flex)"
    return [why, *made, f"{out} = {RUN}.attention({', '.join(args)})"]


def _values(em, step: Flex) -> dict[str, str]:
    """The spec's names -> their code: the tensors read (batch axes flattened into one, in
    their declared order), sizes and scalars."""
    found = {}
    for tensor, op in zip(step.tensors, step.reads):
        own = tuple(i for axis in tensor.layout for i in axis)
        code = relayout(em.ref(op), op.dims, own) if op.dims != own else em.ref(op)
        found[tensor.ascii] = f"{RUN}.flat({code}, {len(own)})" if op.batched else code
    for symbol, ascii in zip(em.spec.sizes, em.spec.size_asciis):
        found.setdefault(ascii, symbol)
    for scalar in em.spec.scalars:
        found.setdefault(scalar.ascii, scalar.symbol)
    return found


def _code(em, value) -> str:
    return value if isinstance(value, str) else em.scalar(value)


def _bound(em, step, printer, hint: str, values: dict) -> str:
    source = printer(em.spec, step, hint)
    name = em.helper(lambda n: printer(em.spec, step, n).text, hint)
    return _partial(em, name, source, values)


def _partial(em, name: str, source: mods.Source, values: dict, skip=()) -> str:
    bound = [f"{p}={_code(em, values[n])}" for p, n in source.keywords if n not in skip]
    return f"{RUN}.bind({', '.join([name, *bound])})" if bound else name


def _box(em, step, hint: str, values: dict) -> str:
    source, stats = mods.box(em.spec, step, hint)
    name = em.helper(lambda n: mods.box(em.spec, step, n)[0].text, hint)
    ends = {n for st in stats for n in (st.lo, st.hi)}
    return _partial(em, name, source, values, skip=ends)


def _block_mask(em, step: Flex, mask: str, box: str, values: dict) -> str:
    _, stats = mods.box(em.spec, step)
    reads = [f"({s.lo!r}, {s.hi!r}, {s.side!r}, {values[s.tensor]})" for s in stats]
    reads_head = any(i.symbol in step.keep.free_symbols for i in step.head_indices)
    heads = em.scalar(_product(step.head_indices)) if reads_head else "1"
    batch = f"{q_batch(em, step)}" if stats else "1"
    em.needs.device = True
    return (
        f"{RUN}.block_mask({mask}, {box}, ({', '.join(reads)}{',' if len(reads) == 1 else ''}), "
        f"batch={batch}, heads={heads}, n_q={em.size(step.query)}, n_kv={em.size(step.key)}, "
        "device=device)"
    )


def q_batch(em, step: Flex) -> str:
    first = step.q[0]
    return f"{em.ref(first)}.shape[:-{len(first.dims)}].numel()" if first.batched else "1"


def _product(indices):
    import sympy

    return sympy.Mul(*(i.size for i in indices))
