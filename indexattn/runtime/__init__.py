"""Generated source -> callable and nn.Module: compile once per spec text, solve sizes once
per shape, check every call's shapes, keep per-shape constants."""

from .compiled import CompiledSpec, compile_spec
from .module import SpecModule

__all__ = ["CompiledSpec", "SpecModule", "compile_spec"]
