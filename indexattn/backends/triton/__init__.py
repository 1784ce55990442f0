"""The `triton` backend: the attention core of a spec as fused Triton kernels, printed from its
equations, forward and backward (`core` reads the core, `emit` prints the kernels, `launch`
runs them, `whole` runs a whole spec with its core on them). On a CPU the kernels run in
Triton's interpreter; without the triton package the backend is refused by name. Nothing
heavy is imported here: naming the backend costs no sympy."""

from __future__ import annotations

import importlib.util

NAME = "triton"
MISSING = "the triton backend needs the triton package: pip install 'indexattn[triton]'"
__all__ = ["MISSING", "NAME", "available", "reads", "refuses_call", "run", "takes"]


def available() -> bool:
    return importlib.util.find_spec("triton") is not None


def takes(core) -> str | None:
    """Why the kernels cannot compute this core (a `core.Core`); None where they can: every
    core `core.describe` reads (it refuses the others, with the reason, as it reads them)."""
    return None


def refuses_call(spec, values: dict, training: bool, device: str) -> str | None:
    """Why the kernels cannot run this call of a spec compiled with them (a `CompiledSpec`;
    `values`: the call's sizes and scalars by symbol); None where they can. Their widths are
    padded to 16 (tl.dot's least), so only dropout is refused."""
    from .core import describe
    from .whole import refused_dropout

    return refused_dropout(describe(spec.ir), values, training)


def reads(spec):
    """The spec's attention core as the kernels compute it (`core.Core`), or `core.Refused`
    saying why not: the triton package missing, or what `describe` cannot read."""
    from .core import Refused, describe

    if not available():
        raise Refused(MISSING)
    return describe(spec)


def run(spec, /, **kwargs):
    """A spec's outputs with its attention core on the printed kernels: `spec` a checked
    `ir.Spec`, or what `indexattn.compile_spec` takes (a shipped name, a path, text)."""
    from .core import Refused

    if not available():
        raise Refused(MISSING)
    from . import whole

    return whole.run(_checked(spec), **kwargs)


def _checked(spec):
    """A checked `ir.Spec` from one, a shipped spec's name, a path or a spec's text: read here,
    not through runtime/ (which imports the planner, which imports the backends)."""
    import os
    from pathlib import Path

    from ... import catalog, ir

    if isinstance(spec, ir.Spec):
        return spec
    if isinstance(spec, str) and catalog.looks_like_a_name(spec):
        spec = catalog.shipped(spec)
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and spec.endswith(".attn")):
        path = Path(spec)
        return ir.check(path.read_text(encoding="utf-8"), path.stem, str(path))
    return ir.check(spec, "spec", "<spec>")
