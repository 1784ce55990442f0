"""`FILE.py:CLASS` -> a module and its example inputs, for `indexattn lift`: the class built
with no arguments; the inputs from `--shape` (random floats, one shape per positional input)
or else from the file's own `example_inputs()` function."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from .errors import LiftError


def load(target: str, shapes: list[tuple[int, ...]]):
    """`load("layers.py:CausalSelfAttention", [(2, 8, 16)])` -> (module, inputs)."""
    import torch

    path, _, name = target.rpartition(":")
    if not path or not name:
        raise LiftError(f"{target}: write FILE.py:CLASS, e.g. model.py:CausalSelfAttention")
    file = Path(path)
    if not file.is_file():
        raise LiftError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location(f"_indexattn_lift_{file.stem}", file)
    code = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.resolve().parent))  # its own imports beside it
    try:
        spec.loader.exec_module(code)
    finally:
        sys.path.pop(0)
    cls = getattr(code, name, None)
    if cls is None:
        raise LiftError(f"{path} defines no {name}")
    module = cls()
    if shapes:
        generator = torch.Generator().manual_seed(0)
        return module, tuple(torch.randn(s, generator=generator) for s in shapes)
    examples = getattr(code, "example_inputs", None)
    if examples is None:
        raise LiftError(
            f"{path}: say the example inputs, --shape 2,8,16 (one per positional input), "
            "or define example_inputs() in the file"
        )
    inputs = examples()
    return module, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
