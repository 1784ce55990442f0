"""indexattn: attention written in Einstein index notation, compiled to readable PyTorch,
LaTeX, and exact symbolic counts.

>>> import indexattn
>>> spec = indexattn.compile_spec("mha")  # doctest: +SKIP
"""

from .catalog import shipped, shipped_specs
from .errors import IndexAttnError, ShapeError, SpecError
from .parallel.relayout import (
    relayout,  # needs no torch until called; the function hides the module
)

__all__ = [
    "CompiledSpec",
    "IndexAttnError",
    "ShapeError",
    "SpecError",
    "SpecModule",
    "attend",
    "compile_spec",
    "lift",
    "relayout",
    "shipped",
    "shipped_specs",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # torch is imported on first use, so that `indexattn latex` and `count` start fast.
    if name in ("compile_spec", "CompiledSpec"):  # the spec that runs and shows itself
        from . import spec

        return getattr(spec, name)
    if name == "attend":  # equations inline, every range read off the tensors
        import importlib

        return importlib.import_module(".inline", __name__).attend
    if name == "lift":  # a module lifted to the spec it computes (indexattn/lifting/)
        import importlib

        return importlib.import_module(".lifting", __name__).lift
    if name == "SpecModule":
        from . import runtime

        return runtime.SpecModule
    if name == "distributed":  # torch.distributed, only when asked for
        import importlib

        return importlib.import_module(".distributed", __name__)
    raise AttributeError(f"module 'indexattn' has no attribute {name!r}")
