"""Every identifier of a generated module, chosen in one place: the function's arguments
(the spec's own ASCII names), sizes, scalars, the functions, locals, index variables and
einops axis names. Nothing can shadow an import, a builtin, a keyword or another name;
the choice depends only on the plan, so the same spec gives the same source everywhere."""

from __future__ import annotations

import keyword

from ..ir import Index, Spec
from ..notation.names import RESERVED, ascii_name, fresh
from .steps import Var


class Names:
    """Allocates Python names for one module; `einops` names live in their own namespace
    (they are strings in patterns, with einops' own rules)."""

    def __init__(self, spec: Spec) -> None:
        fixed = [t.ascii for t in spec.arguments]
        fixed += list(spec.size_asciis) + [s.ascii for s in spec.scalars]
        self.taken = set(RESERVED) | set(keyword.kwlist) | set(keyword.softkwlist) | set(fixed)
        self.vars: dict[Var, str] = {}
        self.indices: dict[Index, str] = {}
        self.axes: dict[Index, str] = {}
        self.axis_taken: set[str] = set()
        # The spec's own name, even when an argument has it too: the function never calls
        # itself, so a parameter of the same name shadows nothing it needs.
        self.function = ascii_name(spec.name)
        self.taken.add(self.function)
        self.constants = self.fresh(self.function + "_constants")

    def fresh(self, hint: str) -> str:
        """`hint` if free, else `hint_2`, `hint_3`, ...; reserved from then on."""
        return fresh(hint, self.taken)

    def var(self, var: Var) -> str:
        if var.argument:
            return var.hint
        if var not in self.vars:
            self.vars[var] = self.fresh(var.hint)
        return self.vars[var]

    def index(self, index: Index) -> str:
        """The variable holding an index's positions (`tau = torch.arange(N)`)."""
        if index not in self.indices:
            self.indices[index] = self.fresh(index.ascii)
        return self.indices[index]

    def axis(self, index: Index) -> str:
        """An einops axis name: an identifier that neither starts nor ends with `_` and is no
        keyword (einops rejects the first, warns on the second)."""
        if index not in self.axes:
            base = index.ascii.strip("_") or "axis"
            base = base + "_axis" if keyword.iskeyword(base) or base[0].isdigit() else base
            name, k = base, 1
            while name in self.axis_taken:
                k += 1
                name = f"{base}{k}"
            self.axis_taken.add(name)
            self.axes[index] = name
        return self.axes[index]
