"""What cannot be lifted, named: the op, the graph node and the module's own source line."""

from __future__ import annotations

from ..errors import IndexAttnError


class LiftError(IndexAttnError, ValueError):
    """A module (or one node of its graph) that `indexattn.lift` cannot write as a spec."""


def at_node(error: LiftError, node) -> LiftError:
    """The error with the node it arose at: `aten.cumsum.default` at node `cumsum`, and the
    module's line from the node's stack trace."""
    if getattr(error, "node", None) is not None:
        return error
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames = [line.strip() for line in trace if line.strip().startswith("File ")]
    line = ""
    if frames:
        last = trace.index(next(t for t in trace if t.strip() == frames[-1]))
        code = trace[last + 1].strip() if last + 1 < len(trace) else ""
        line = f"\n  {frames[-1]}\n    {code}"
    out = LiftError(f"cannot lift {node.target} (graph node {node.name}): {error}{line}")
    out.node = node
    return out
