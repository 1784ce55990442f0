"""The compiled spec a user holds: what runs it (runtime/) and what shows it to a person
(views/: LaTeX, counts, Markdown) in one object. The runtime imports no view; this module,
above both stages, joins them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .runtime import compiled

if TYPE_CHECKING:
    import sympy


class CompiledSpec(compiled.CompiledSpec):
    """A compiled spec (runtime/compiled.py) that also shows itself: its equations as LaTeX,
    its parameters and FLOPs as formulas, its page in a notebook."""

    def param_count(self) -> sympy.Expr:
        """Learnable numbers in the size symbols, e.g. 4*d_m**2 + d_m."""
        from .views import cost

        return cost.param_count(self.ir)

    def flops(self) -> sympy.Expr:
        """Floating-point operations of one forward pass per batch element, along the steps
        the generated code takes (see indexattn/views/cost.py for what each step costs)."""
        from .views import cost

        return cost.flops(self.program)

    def latex(self, *, raised: bool = False, sums: bool = False) -> str:
        r"""The equations as an amsmath `align` environment; `raised=True` writes a contracted
        index up on its second use (`X_{\tau}{}^{i}`), `sums=True` writes the sums."""
        from .views import latex

        return latex.latex(self.ir, raised=raised, sums=sums)

    def _repr_latex_(self) -> str:
        from .views import latex

        return "$$" + latex.latex(self.ir, environment="aligned") + "$$"

    def _repr_markdown_(self) -> str:
        from .views import markdown

        return (
            markdown.head(self.ir, index=False)
            + "\n"
            + markdown.equations(self.ir, markdown.NOTEBOOK_MATH)
        )

    def _module_markdown(self, parameters: int, sizes: dict[str, int]) -> str:
        """A layer of this spec in a notebook: the spec's page, then the parameters the layer
        holds, counted, and the spec's formula for them."""
        from .views.latex import formula

        at = ", ".join(f"{k} = {v}" for k, v in sizes.items())
        return (
            self._repr_markdown_()
            + f"\n**{parameters:,} parameters**"
            + (f" at ${at}$" if at else "")
            + f": ${formula(self.param_count())}$\n"
        )


def compile_spec(
    spec: str | Path, name: str | None = None, *, backend: str = "auto"
) -> CompiledSpec:
    """runtime.compiled.compile_spec, giving the spec that also shows itself; `backend`:
    what computes the attention core ("auto", "blocks", "sdpa", "flex", "triton": docs/backends.md).

    >>> spec = compile_spec("index i : n\\ninput x_<i>\\ny_<i> = 2 x_<i>", name="double")
    >>> print(spec.latex(), end="")
    \\begin{align}
      y_{i} &= 2 x_{i}
    \\end{align}
    """
    return compiled.compile_spec(spec, name, kind=CompiledSpec, backend=backend)
