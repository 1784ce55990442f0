"""What the sequence split sends per rank in one training step, counted like FLOPs
(`indexattn count SPEC --context W [--ring]`): Ulysses' all-to-alls (sequence.ulysses_sent)
and the ring's P2P blocks. The ring's count reads how each of its passes runs (tiles.kept: a
pass made from its rows' statistics sends its blocks once more in the backward), so it sits
above the tile cores, which compile specs."""

from __future__ import annotations

import sympy

from .. import ir
from ..errors import SpecError
from .sequence import (
    RANKS,
    SHARE,
    Sent,
    SequencePlan,
    balanced,
    position_map,
    ring_form,
    ring_passes,
    ulysses_sent,
    work_lines,
)
from .tiles import core, defaults, kept


def ring_sent(spec: ir.Spec, plan: SequencePlan) -> tuple[Sent, ...]:
    """What the ring (`context_parallel(..., strategy="ring")`) sends per rank in one training
    step where every rank's queries read every key of every other (no mask): each
    travelling block to w - 1 ranks, its gradient back, and the block once more where the
    pass makes its gradients from the rows' merged statistics (tiles.kept: it keeps no
    visiting block); parameters' gradients summed. A mask sends less: each rank's P2P at
    given sizes is `ring_sent_ranks`'. A softmax whose statistics need their own pass (a
    sink's logsumexp) sends its scores' inputs once more: one pass for each
    (`ring_passes`)."""
    if not plan.splittable:
        raise SpecError(plan.verdict())
    found = []
    tensors = {t.name: t for t in spec.tensors}
    passes = [p for each in ring_passes(spec, plan).values() for p in each]
    sends = [n for p in passes for n in p.travels]
    run = ring_form(spec, plan)
    values = defaults(spec)  # a dropout's probability as declared
    again = [n for p in passes if kept(core(run, plan, p), values) for n in p.travels]
    for name in dict.fromkeys(sends):
        t = tensors[name]
        block = sympy.Mul(*t.shape) * (RANKS - 1) / RANKS
        found.append(Sent(repr(t), "send/recv", "forward", sympy.factor(block * sends.count(name))))
        back = again.count(name) + (sends.count(name) if t.dtype != "int" else 0)
        if back:
            found.append(Sent(repr(t), "send/recv", "backward", sympy.factor(block * back)))
    split = dict(plan.split)
    for t in spec.tensors_of("param", "input"):
        if t.dtype != "int" and repr(t) not in split:
            whole = sympy.Mul(*t.shape) * SHARE["all-reduce"]
            phase = "gradient" if t.role == "param" else "backward"
            found.append(Sent(repr(t), "all-reduce", phase, sympy.factor(whole)))
    return tuple(found)


def ring_sent_ranks(
    spec: ir.Spec, plan: SequencePlan, sizes: dict, world: int, layout, tile=None
) -> list[int]:
    """The P2P elements each rank sends in one training step of the ring, per batch element,
    read off the block map of positions (`sizes` by symbol, scalars too; tiles of `tile`
    positions, or those the map chooses): each travelling block to the ranks whose queries
    read it, where the pass makes its gradients from its rows' statistics (tiles.kept) only
    the runs their tile pairs read (sequence.read_runs), and those once more in the
    backward; and the gradients of the blocks it received, back to their owners. What a
    call's `last_ring["sent"]` counts (a mask reading document ids: an upper bound);
    `ring_sent` is its most."""
    block_map = position_map(spec, plan, sizes, world, layout, tile)
    run, values = ring_form(spec, plan), defaults(spec)
    tensors, found = {t.name: t for t in spec.tensors}, [0] * world
    for each in (p for passes in ring_passes(spec, plan).values() for p in passes):
        again = kept(core(run, plan, each), values)
        for name in each.travels:
            t = tensors[name]
            along = next(i for i in t.indices if i.glyph in plan.indices)
            width = int(sympy.Mul(*t.shape).subs(sizes) / along.size.subs(sizes))
            for r in range(world):
                moved = block_map.sent(r, again) * (1 + again)
                moved += block_map.received(r, again) if t.dtype != "int" else 0
                found[r] += width * moved
    return found


def _rank_lines(spec: ir.Spec, plan: SequencePlan, sizes: dict, ranks: int) -> list[str]:
    """Each rank's P2P at these sizes on the layout that balances its work (ring_sent_ranks);
    none where the block map cannot be made."""
    layout = balanced(spec, plan, sizes, ranks)
    if layout is None:
        return []
    cells = "  ".join(f"{n:,}" for n in ring_sent_ranks(spec, plan, sizes, ranks, layout))
    return [
        f"P2P elements each rank sends in one training step on {layout} blocks, per batch "
        "element, read off the block map (the keys its readers' tile pairs read; the send/recv "
        "rows above are the most)",
        f"  {cells}",
    ]


def sent_table(
    spec: ir.Spec, plan: SequencePlan, sizes: dict, ranks: int, strategy: str = "ulysses"
) -> str:
    """`indexattn count SPEC --context W [--ring]`: what each rank sends in one training
    step."""
    ring = strategy == "ring"
    if not (plan.splittable if ring else plan.ulysses):
        raise SpecError(plan.verdict())
    rows = ring_sent(spec, plan) if ring else ulysses_sent(spec, plan)
    cells = [
        (s.tensor, s.collective, s.phase, str(s.elements), f"{s.at(sizes, ranks):,}") for s in rows
    ]
    widths = [max(len(c[k]) for c in cells) for k in range(5)]
    lines = [
        f"Elements sent per rank in one training step, {', '.join(plan.indices)} split over "
        f"w = {ranks} ranks ({'ring' if ring else f'Ulysses over {plan.heads}'}); per batch "
        "element, gradients of parameters once per step"
    ]
    for c in cells:
        lines.append(
            "  " + "  ".join(c[k].ljust(widths[k]) for k in range(4)) + "  " + c[4].rjust(widths[4])
        )
    per_item = sum(s.at(sizes, ranks) for s in rows if s.phase != "gradient")
    once = sum(s.at(sizes, ranks) for s in rows if s.phase == "gradient")
    lines.append(
        f"  total: {per_item:,} per batch element ({_bytes(per_item * 4)} in float32), "
        f"and {once:,} per step ({_bytes(once * 4)})"
    )
    if ring:
        lines += _rank_lines(spec, plan, sizes, ranks) + work_lines(spec, plan, sizes, ranks)
    return "\n".join(lines) + "\n"


def _bytes(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} B"
