"""Generated source -> callable and nn.Module: compile once per spec text, solve sizes once
per shape, check every call's shapes, keep per-shape constants."""

from .compiled import CompiledSpec, compile_spec

__all__ = ["CompiledSpec", "SpecModule", "compile_spec"]


def __getattr__(name: str):
    if name == "SpecModule":  # imported on first use (torch.nn)
        from .module import SpecModule

        return SpecModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
