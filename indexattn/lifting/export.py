"""Module -> exported graph: `torch.export` with the batch and the sequence length of every
input dynamic, so that the graph's sizes say which axes run along the sequence."""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from .errors import LiftError


@dataclass(frozen=True)
class Exported:
    """The ATen graph, what each placeholder is (input, param, buffer or constant, and its
    state_dict key or the forward's argument name), the outputs' nodes, the sequence's size
    symbols and the forward's argument names in order."""

    program: object
    placeholders: dict
    outputs: tuple[str, ...]
    sequence: frozenset
    arguments: tuple[str, ...]


def export_module(module: torch.nn.Module, *inputs: torch.Tensor) -> Exported:
    """`export_module(layer, x)`: dims 0 and 1 of every input of two or more axes dynamic
    (batch and sequence; an example batch of 1 lets export fix it, so give 2 or more)."""
    from torch.export import Dim, export

    for x in inputs:
        if not isinstance(x, torch.Tensor):
            raise LiftError(f"lift takes example tensors, not {type(x).__name__}")
    dynamic = tuple({0: Dim.AUTO, 1: Dim.AUTO} if x.dim() >= 2 else {} for x in inputs)
    was_training = module.training
    module.eval()
    try:
        program = export(module, tuple(inputs), dynamic_shapes=dynamic)
    except Exception as error:  # export's own message says which line it could not trace
        raise LiftError(f"torch.export could not trace the module: {error}") from error
    finally:
        module.train(was_training)
    signature = program.graph_signature
    placeholders = {}
    for name in signature.user_inputs:
        placeholders[name] = ("input", name)
    for name, target in signature.inputs_to_parameters.items():
        placeholders[name] = ("param", target)
    for name, target in signature.inputs_to_buffers.items():
        placeholders[name] = ("buffer", target)
    for name, target in signature.inputs_to_lifted_tensor_constants.items():
        placeholders[name] = ("buffer", target)
    sequence = set()
    nodes = {n.name: n for n in program.graph_module.graph.nodes}
    for name in signature.user_inputs:
        shape = nodes[name].meta["val"].shape
        if len(shape) >= 2 and isinstance(shape[1], torch.SymInt):
            sequence |= sympy.sympify(str(shape[1].node.expr)).free_symbols
    outputs = tuple(str(o) for o in signature.user_outputs)
    return Exported(
        program, placeholders, outputs, frozenset(sequence), tuple(signature.user_inputs)
    )
