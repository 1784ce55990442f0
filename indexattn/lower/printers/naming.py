"""Every identifier of a generated module, chosen in one place: the function's arguments
(the spec's own ASCII names), sizes, scalars, the functions, locals, index variables and
einops axis names. Nothing can shadow an import, a builtin, a keyword or another name;
the choice depends only on the plan, so the same spec gives the same source everywhere."""

from __future__ import annotations

import keyword

from ...ir import Index, Spec
from ...notation.names import RESERVED, ascii_name, fresh
from ..program.kinds import over, reads
from ..program.program import Program
from ..program.steps import Contract, Elementwise, Grid, Step, Var


class Names:
    """Allocates Python names for one module; `einops` names live in their own namespace
    (they are strings in patterns, with einops' own rules)."""

    def __init__(self, spec: Spec) -> None:
        fixed = [t.ascii for t in spec.arguments]
        fixed += list(spec.size_asciis) + [s.ascii for s in spec.scalars]
        self.taken = set(RESERVED) | set(keyword.kwlist) | set(keyword.softkwlist) | set(fixed)
        self.vars: dict[Var, str] = {}
        self.same: dict[Var, Var] = {}  # a value printed under another's name (written_over)
        self.hints: dict[Var, str] = {}  # a hint in place of the planner's (shared_hints)
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
        var = self.same.get(var, var)
        if var not in self.vars:
            self.vars[var] = self.fresh(self.hints.get(var, var.hint))
        return self.vars[var]

    def dropped(self, drop) -> list[str]:
        """`del` of these locals, each name once: a result written over its operand shares
        the operand's name (lower/program/passes/inplace.py), and both die together."""
        names = dict.fromkeys(self.var(v) for v in drop)
        return [f"del {', '.join(names)}"] if names else []

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


def written_over(program: Program) -> dict[Var, Var]:
    """Each value that shares a name with another, and that other: a result written over a
    tensor (`kinds.over`) is that tensor, so it keeps its name (`R.div_(c)`, not
    `S_prod = R.div_(c)`), unless a later value of the same storage in the same block is that
    block's equation's: then the storage is named after the equation from where the block
    makes it (`S = S_tanh * c`, then `S.add_(M)`). A value of an equation keeps its own name."""
    block_of, target, equation = {}, {}, set()
    for b, block in enumerate(program.blocks):
        own = {eq.tensor.ascii for eq in block.equations}
        for step in block.steps:
            block_of[step.out.var] = b
            equation |= {step.out.var} if step.out.var.hint in own else set()
            written = over(step)
            if written is not None and not written.var.argument:
                target[step.out.var] = written.var
    following = {t: v for v, t in target.items()}
    same: dict[Var, Var] = {}
    for var in (v for v in block_of if v in target or v in following):
        later = var
        while later not in equation and block_of.get(following.get(later)) == block_of[var]:
            later = following[later]
        name = later if later in equation else same.get(target.get(var), target.get(var, var))
        if name != var:
            same[var] = name
    return same


def shared_hints(program: Program) -> dict[Var, str]:
    """Tables one equation's block makes and another's reads, named by what they are, not
    after the first equation: rotary tables are `cos` and `sin`, not `Qr_cos` read by the
    keys too; a product of tables joins its parts' names (`sin_grid`), and the parts made for
    it are renamed alike. A table is a function (its name), a grid of positions, or a product."""
    block_of: dict[Var, int] = {}
    steps: dict[Var, Step] = {}
    readers: dict[Var, set[int]] = {}
    for b, block in enumerate(program.blocks):
        for step in block.steps:
            block_of[step.out.var], steps[step.out.var] = b, step
            for operand in reads(step):
                readers.setdefault(operand.var, set()).add(b)
    hints: dict[Var, str] = {}

    def hint(var: Var, prefix: str) -> str:
        """The var's hint, renamed where it is a table of the block's equation's parts."""
        step = steps.get(var)
        if var in hints or not isinstance(step, Contract | Elementwise | Grid):
            return hints.get(var, var.hint)
        if not var.hint.startswith(prefix):
            return var.hint
        if isinstance(step, Contract) and len(step.args) > 1:
            parts = [hint(a.var, prefix) for a in step.args if a.var in steps]
            hints[var] = "_".join(parts) if parts else var.hint.removeprefix(prefix)
        else:
            hints[var] = "sign" if _sign(step) else var.hint.removeprefix(prefix)
        return hints[var]

    for b, block in enumerate(program.blocks):
        for eq in block.equations:
            for step in block.steps:
                if readers.get(step.out.var, set()) - {b}:
                    hint(step.out.var, eq.tensor.ascii + "_")
    return hints


def _sign(step: Step) -> bool:
    """A grid over one index of a few positions whose every value is -1 or 1 (`2 c - 1`)."""
    if not isinstance(step, Grid) or len(step.out.dims) != 1 or step.index:
        return False
    index = step.out.dims[0]
    if not (index.size.is_Integer and index.size <= 16):
        return False
    values = {step.expr.subs(index.symbol, k) for k in range(int(index.size))}
    return values <= {-1, 1}
