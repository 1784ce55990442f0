"""The triton backend against the oracle: a spec's outputs and gradients through the printed
kernels (Triton's interpreter on a CPU) and through the literal reading with autograd, on the
same random arguments; the largest error of each, relative to the largest value (absolute
below 1). tests/test_triton_backend.py asserts on it; benchmarks/triton_interpreter.py
prints it for every case."""

from __future__ import annotations

import torch

from ...oracle.reference import evaluate
from ...oracle.verify import sample_arguments, sample_sizes

# The interpreter suite's specs: (name, sizes, what it shows). CASES run in every test run,
# SLOW in the slow ones (each is seconds of the interpreter).
CASES = (
    ("sinks_core", {"N": 37, "N_kv": 37, "h_kv": 2, "n_rep": 2}, "learned sink, GQA, a mask"),
    ("attention_sinks", {"N": 33, "h_kv": 1, "n_rep": 2, "d_k": 4, "d_m": 4}, "sink, window"),
    ("sigmoid_attention", {"N": 37, "h": 2, "d_k": 3, "d_m": 4}, "sigmoid, causal"),
)
SLOW = (
    ("softcap_window", {"N": 35, "d_k": 4, "d_m": 4}, "soft cap and window"),
    ("alibi", {"N": 20, "h": 2}, "ALiBi slopes from the head index"),
    ("doc_mask", {"N": 40, "h": 1}, "document ids: integer loads"),
    ("gqa_causal_core", {"N": 1, "N_kv": 1}, "one position"),
    ("mqa", {"N": 17, "h": 3}, "one key head for all query heads"),
    ("causal_head", {"N": 50}, "causal, no heads"),
)

# The sweep across block edges: each feature at N = EDGES (and N_kv = N), at the GPU's block
# of 64 rows and keys, batched: (name, sizes but N, what it shows).
EDGES = (1, 63, 64, 65, 130, 300)
SWEPT = (
    ("sinks_core", {"h_kv": 1, "n_rep": 2}, "learned sink, GQA, a mask"),
    ("softcap_window", {"d_k": 4, "d_m": 4, "h": 1}, "soft cap and window"),
    ("alibi", {"h": 2, "d_k": 4, "d_m": 4}, "ALiBi"),
    ("doc_mask", {"h": 1, "d_k": 4, "d_m": 4}, "document ids"),
    ("mqa", {"h": 2, "d_k": 4, "d_m": 4}, "one key head for all query heads"),
)
SWEPT_BLOCK = 64


def at_length(name: str, sizes: dict, n: int) -> dict:
    """`sizes` with the positions N (and the keys' N_kv, where the spec has them) at n."""
    return {**sizes, "N": n, **({"N_kv": n} if "N_kv" in _size_names(name) else {})}


def _size_names(name: str) -> frozenset:
    from ...runtime.compiled import compile_spec

    return frozenset(compile_spec(name).ir.size_asciis)


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """inf where either holds a NaN (a max over errors would skip it)."""
    if got.isnan().any() or want.isnan().any():
        return float("inf")
    return ((got - want).abs().max() / want.abs().max().clamp_min(1.0)).item()


def learnable(spec) -> list[str]:
    """The float arguments whose gradients the kernels give: all but the tensors the scores
    read element by element without a derivative there (integer ids; masks read in a
    condition only)."""
    from .core import describe
    from .emit import generate

    kernels = generate(describe(spec))
    ungraded = {x.tensor.ascii for _, x in kernels.loads} - {x.tensor.ascii for x in kernels.graded}
    return [t.ascii for t in spec.arguments if t.dtype != "int" and t.ascii not in ungraded]


def compare(
    spec,
    sizes: dict,
    *,
    dtype=torch.float32,
    batch=(2,),
    edit=None,
    learned=None,
    splits=1,
    block=None,
):
    """{"forward": error, name: error of its gradient, ...}: `learned` names the arguments
    whose gradients are compared (default: `learnable`); `edit` changes the arguments
    first (a dead row); `splits`: the forward split-K in that many chunks; `block`: rows
    and keys per program (default launch.BLOCK)."""
    from . import run

    sizes = sample_sizes(spec, fixed=sizes)
    args = sample_arguments(spec, sizes, batch=batch, dtype=dtype, seed=1)
    if edit is not None:
        edit(args)
    given = {k: v for k, v in sizes.items() if k in spec.size_asciis}
    if learned is None:
        learned = learnable(spec)
    for n in learned:
        args[n].requires_grad_(True)
    options = {"splits": splits} if block is None else {"splits": splits, "block": block}
    got = run(spec, **options, **args, **given)
    want = evaluate(spec, **args, **given)
    errors = {"forward": max(relative(g, w) for g, w in zip(got, want))}
    seeds = [torch.randn_like(w) for w in want]
    leaves = [args[n] for n in learned]
    mine = torch.autograd.grad(got, leaves, seeds)
    theirs = torch.autograd.grad(want, leaves, seeds)
    errors.update({n: relative(a, b) for n, a, b in zip(learned, mine, theirs)})
    return errors
