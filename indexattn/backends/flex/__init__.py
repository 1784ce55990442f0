"""The FlexAttention backend: a spec's attention core as `flex_attention` with a `score_mod`,
a `mask_mod` and a `BlockMask` read off the notation: core.py reads the core, mods.py prints
the callables, masks.py builds the block mask from the box bounds, emit.py prints a `Flex`
step, run.py is what the generated module calls, callables.py hands the callables to users.
Nothing heavy is imported here: naming the backend costs no sympy."""

from __future__ import annotations

NAME = "flex"


def takes(core) -> str | None:
    """Why FlexAttention cannot compute this core (a `core.Core`); None where it can: every
    core `core.cores` reads (it refuses the others, with the reason, as it reads them)."""
    return None


SMALLEST_WIDTH = 16  # off a CPU, inductor's flex kernel: tl.dot takes no narrower features
DROPOUT = (
    "FlexAttention has no dropout on the attention weights; call with training=False, set the "
    "dropout probability to 0, or use backend='blocks'"
)


def narrow(q_width: int, v_width: int) -> str:
    """Why FlexAttention off a CPU cannot take features this narrow."""
    return (
        f"FlexAttention off a CPU takes features of {SMALLEST_WIDTH} or more (inductor's kernel: "
        f"tl.dot), and this call's are {q_width} (q, k) and {v_width} (v); use "
        "backend='blocks'"
    )


def calls(program) -> int:
    """How many flex_attention calls a program compiled with this backend makes."""
    from ...lower.program.steps import Flex

    return sum(isinstance(s, Flex) for s in program.steps)


def refuses_call(spec, values: dict, training: bool, device: str) -> str | None:
    """Why FlexAttention cannot run this call of a spec compiled with it (a `CompiledSpec`;
    `values`: the call's sizes and scalars by symbol); None where it can. "auto" runs a call
    refused here on the spec's own code (docs/decisions.md, "Backends: what auto chooses")."""
    import sympy

    from ...lower.program.steps import Flex

    for step in (s for s in spec.program.steps if isinstance(s, Flex)):
        if training and step.dropout is not None and float(step.dropout.subs(values)) != 0:
            return DROPOUT
        q_width = int(sum(sympy.Mul(*(i.size for i in part)) for part in step.widths).subs(values))
        v_width = int(step.v_dims[-1].size.subs(values))
        if device != "cpu" and min(q_width, v_width) < SMALLEST_WIDTH:
            return narrow(q_width, v_width)
    return None
