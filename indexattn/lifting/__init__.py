"""A module -> the spec it computes: `lift(module, *example_inputs)`.

The stages, each handing the next a frozen value: export (export.py: torch.export, batch and
sequence dynamic) -> graph facts (facts.py: each ATen node read by the rule of its op, into
tensors and equations over atoms, atoms.py) -> spec text (text.py: glyphs, ranges,
declarations) -> check (check.py: the spec against the module in float64 at sequence lengths
other than the example's). What cannot be lifted is a LiftError naming the op, the graph
node and the module's source line."""

from .errors import LiftError
from .lift import Lifted, lift

__all__ = ["LiftError", "Lifted", "lift"]
