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
