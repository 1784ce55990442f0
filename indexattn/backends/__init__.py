"""The attention core's backends: one module each, every one saying which cores it takes and
why not. The planner (lower/kernels.py) asks the backend named by `backend=` (on
`compile_spec`, `spec.module(...)` and the transformers door) to take each core; "auto" takes
today's choice where the code is compiled (docs/decisions.md, "Backends: what auto chooses").

    >>> from indexattn.backends import BACKENDS
    >>> sorted(BACKENDS)
    ['blocks', 'flex', 'sdpa', 'triton']

A backend is a module with `NAME` and `takes(core) -> str | None` (None: it computes the core;
else the reason it cannot); adding one is a module and one line of `BACKENDS`. The two "auto"
routes calls to off a CPU, flex and triton, also say which calls of a spec they take cannot
run (`refuses_call(spec, values, training, device)`: head widths, dropout in training).
sdpa says how many cores its fused kernels run whole (`fused(program)`), which auto keeps."""

from __future__ import annotations

from types import ModuleType
from typing import Protocol

from . import blocks, flex, sdpa, triton


class Backend(Protocol):
    NAME: str

    def takes(self, core) -> str | None: ...


BACKENDS: dict[str, ModuleType] = {b.NAME: b for b in (blocks, sdpa, flex, triton)}
CHOICES = ("auto", *BACKENDS)


def named(name: str) -> str:
    """The backend's name, checked: a ValueError naming the choices for any other."""
    if name not in CHOICES:
        raise ValueError(f"no backend {name!r}: backend is one of {', '.join(map(repr, CHOICES))}")
    return name


class Refused(ValueError):
    """A backend asked for by name cannot compute a spec's attention core: why."""


def refused(name: str, spec: str, why: str) -> Refused:
    """The error for a backend asked for by name that cannot take a spec's core."""
    return Refused(f"backend={name!r} cannot compute the attention core of {spec}: {why}")


def auto(device: str, flex_takes: bool, triton_takes: bool = False) -> str:
    """What "auto" runs on a device (docs/decisions.md, "Backends: what auto chooses"): on
    CUDA and XPU FlexAttention wherever it takes the spec, else on CUDA the triton kernels
    wherever they take it; elsewhere (CPU: FlexAttention has no backward there, and its
    forward compiles for tens of seconds a shape family; Triton's interpreter is a proof, not
    a speed) the code compiled for every device, the blocked path and SDPA where it computes
    the core exactly. The same on both for training and inference."""
    if device in ("cuda", "xpu") and flex_takes:
        return "flex"
    return "triton" if device == "cuda" and triton_takes else "auto"
