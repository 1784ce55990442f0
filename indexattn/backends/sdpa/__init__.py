"""The `sdpa` backend: `F.scaled_dot_product_attention` where it computes the core exactly
(softmax over the key of scale · q·k plus a mask or bias, times the values; GQA, dropout),
matched by lower/planner/fusion.py (`find_attention`) and printed by its `emit.py`
(`step_Attention`, by blocks of queries over the keys a mask lets each see). Nothing heavy is
imported here: naming the backend costs no sympy."""

from __future__ import annotations

NAME = "sdpa"


def takes(core) -> str | None:
    """None for a core `find_attention` matched (an `AttentionMatch`); else why not."""
    from ...lower.planner.fusion import AttentionMatch

    if isinstance(core, AttentionMatch):
        return None
    return (
        "F.scaled_dot_product_attention computes softmax(scale · q·k + mask) · v; this core "
        "changes its scores otherwise"
    )


def fused(program) -> int:
    """How many of a program's attention cores are SDPA calls its fused kernels (flash,
    memory-efficient) run whole: no mask tensor and no spans of keys, the causal flag at
    most. On a GPU "auto" keeps a spec whose every core is one (on the one H200 run, mha in
    float32: 4.6 ms forward against FlexAttention's 12.3; docs/performance.md)."""
    from ...lower.program.steps import Attention

    return sum(
        isinstance(s, Attention) and s.mask is None and s.spans is None for s in program.steps
    )
