"""The backward of a spec, derived as a spec: the forward's declarations and equations, a
cotangent input `dY` per output, and an equation for the cotangent of every input, param and
buffer that one reaches. The text goes through the same parser and checker as any spec, so
it prints, typesets, counts and compiles like one."""

from __future__ import annotations

from ..ir import Spec
from . import printer
from .reverse import Derivation


def backward_text(spec: Spec, source: str = "", file: str = "<spec>") -> str:
    """The derived backward of a checked spec, as spec text.

    >>> from indexattn.ir import check
    >>> text = "index i : n\\ninput x_<i>\\ny_<i> = exp(x_<i>)"
    >>> print(backward_text(check(text, "e"), text).splitlines()[-2])
    dx_<i> = dy_<i> (exp(x_<i>))
    """
    out = Derivation(spec, source, file).run()
    lines = [f"# Backward of {spec.name}", "#"]
    lines.append("# Derived by indexattn: the forward's equations, then the cotangents.")
    lines += [""] + [f"index {i.glyph} : {printer.field(i.size)}" for i in spec.indices]
    lines += [*out.indices, ""]
    for t in spec.arguments:
        kind = " : int" if t.dtype == "int" else ""
        lines.append(f"{t.role} {printer.ref(t.name, t.layout)}{kind}")
    lines += out.inputs
    lines += [f"scalar {s.name} = {s.value!r}" for s in spec.scalars]
    lines += [""] + [eq.text for eq in spec.equations] + [""] + out.equations
    lines += ["", "output " + ", ".join(out.outputs)]
    return "\n".join(lines) + "\n"
