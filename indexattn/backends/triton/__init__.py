"""The `triton` backend: the attention core of a spec as fused Triton kernels, printed from its
equations, forward and backward (`core` reads the core, `emit` prints the kernels, `launch`
runs them, `whole` runs a whole spec with its core on them). On a CPU the kernels run in
Triton's interpreter; without the triton package the backend is refused by name."""

from __future__ import annotations

import importlib.util

from .core import Core, Refused, describe

NAME = "triton"
__all__ = ["NAME", "Core", "Refused", "available", "describe", "run"]


def available() -> bool:
    return importlib.util.find_spec("triton") is not None


def run(spec, /, **kwargs):
    """A spec's outputs with its attention core on the printed kernels: `spec` a checked
    `ir.Spec`, or what `indexattn.compile_spec` takes (a shipped name, a path, text)."""
    if not available():
        raise Refused(
            "the triton backend needs the triton package: pip install 'indexattn[triton]'"
        )
    from . import whole

    return whole.run(_checked(spec), **kwargs)


def _checked(spec):
    from ...ir import Spec

    if isinstance(spec, Spec):
        return spec
    from ...runtime.compiled import compile_spec

    return compile_spec(spec).ir
