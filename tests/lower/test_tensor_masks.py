"""Issue 51's property over every shipped spec whose mask reads tensors, found by reading the
IR (a condition reading an input, or an input added into the scores over queries and keys),
so that a new spec is swept too, and over the issue's own two masks (a bidirectional
document mask, ids along queries and keys of their own lengths: test_exact_ids.py):

(a) integer ids near 2^53 and 2^62, adjacent documents one apart (2^53 and 2^53 + 1 are one
    number in float64), at N = 150: five blocks of queries and of keys;
(b) queries and keys of different lengths, N = 1 against 300 keys, 70 against 300, and 300
    against 70 where the spec admits more queries than keys.

Each through the default backend and the blocked one (`backend="blocks"`), blocks forced
small, both backwards: values and every gradient against the literal interpreter, float64.
The shipped specs' id masks are causal, so a box never decides a whole block of keys there
(the diagonal tile is always read): the issue's bidirectional mask is the one that failed."""

from functools import cache
from pathlib import Path

import pytest
import sympy
import torch
from test_exact_ids import CROSS, DOCUMENTS

import indexattn
from indexattn import ir
from indexattn.ir.sequence import sequence_indices
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import lib as rt

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    **{
        str(p.relative_to(ROOT)): p
        for p in sorted((ROOT / "specs").rglob("*.attn"))
        + sorted((ROOT / "benchmarks/specs").glob("*.attn"))
    },
    "documents": DOCUMENTS,  # the issue's: bidirectional, 0.42 off before
    "cross_ids": CROSS,  # the issue's: `stack expects each tensor to be equal size` before
}
SMALL = {"QUERY_BLOCK": 32, "BLOCK_SCORES": 1, "BLOCK_ROWS": 8}  # several blocks of each axis
RUNS = [("auto", "autograd"), ("blocks", "autograd"), ("auto", "derived")]
BASES = {  # the first document's id; the next ones count up by one
    "2^53": 2**53,  # 2^53 and 2^53 + 1 adjacent: one number in float64
    "2^53 - 1": 2**53 - 1,
    "2^62 - 3": 2**62 - 3,  # across 2^62
    "2^62 + 5": 2**62 + 5,
    "-2^62 - 2": -(2**62) - 2,
}
LENGTHS = {"1 against 300": (1, 300), "70 against 300": (70, 300), "300 against 70": (300, 70)}


@cache
def checked(name: str) -> ir.Spec:
    source = SOURCES[name]
    text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
    return ir.check(text, Path(name).stem, name)


def compiled(name: str, backend: str = "auto"):
    source = SOURCES[name]
    named = None if isinstance(source, Path) else name
    return indexattn.compile_spec(source, named, backend=backend)


def expanded(node, equations, seen=None):
    """Every node of `node`, and of the equations of the derived tensors it reads, once."""
    seen = set() if seen is None else seen
    for n in ir.walk(node):
        yield n
        if isinstance(n, ir.Ref) and n.tensor.role == "derived" and n.tensor.name not in seen:
            seen.add(n.tensor.name)
            yield from expanded(equations[n.tensor.name].rhs, equations, seen)


def inputs_read(node, equations) -> set:
    found = expanded(node, equations)
    return {n.tensor for n in found if isinstance(n, ir.Ref) and n.tensor.role == "input"}


@cache
def masks(name: str):
    """((the integer ids a mask's condition reads, the inputs added into the scores over
    queries and keys), (the query and key indices of the softmax over them)), or None where
    no mask reads a tensor (NSA's top-k selection, a condition of float inputs: ((), ()))."""
    spec = checked(name)
    equations = {eq.tensor.name: eq for eq in spec.equations}
    along = sequence_indices(spec)
    for eq in spec.equations:
        for node in ir.walk(eq.rhs):
            if isinstance(node, ir.Reduce) and node.fn == "softmax":
                found = tensor_masks(node, equations, along)
                if found:
                    return found
    return None


def tensor_masks(softmax, equations, along):
    ids, added, reading = set(), set(), set()
    for n in expanded(softmax.body, equations):
        if ir.is_condition(n) and inputs_read(n, equations):
            ids |= {t.ascii for t in inputs_read(n, equations) if t.dtype == "int"}
            reading |= set(n.free) | {None}
        for t in n.terms if isinstance(n, ir.Sum) else ():  # added over both axes
            if isinstance(t, ir.Ref) and t.tensor.role == "input" and len(set(t.free) & along) == 2:
                added.add(t.tensor.ascii)
                reading |= set(t.free)
    if not reading:
        return None
    (key,) = softmax.over
    query = [i for i in softmax.free if i in reading & along and i != key] or [key]
    return (tuple(sorted(ids)), tuple(sorted(added))), (query[0], key)


MASKED = [name for name in SOURCES if masks(name)]
WITH_IDS = [name for name in MASKED if masks(name)[0][0]]


def sizes_for(name: str, n_q: int, n_k: int) -> dict | None:
    """The sizes (by name) giving `n_q` queries and `n_k` keys, or None where the spec cannot
    have them (one size for both and n_q != n_k, or a size that would be negative)."""
    spec = checked(name)
    _, (query, key) = masks(name)
    (q,) = query.size.free_symbols
    fixed, rest = {spec.size_ascii(q): n_q}, key.size.subs(q, n_q)
    if rest.free_symbols:
        (k,) = rest.free_symbols
        solved = sympy.solve(rest - n_k, k)  # none where it would be negative
        if not solved:
            return None
        fixed[spec.size_ascii(k)] = int(solved[0])
    elif rest != n_k:
        return None
    try:
        return sample_sizes(spec, fixed=fixed)
    except ValueError:
        return None


def hiding(shape, seed: int) -> torch.Tensor:
    """An additive mask: 0 or -inf, runs of hidden keys across tiles, a tenth flipped, and
    one key seen by every query (no dead rows: the doors differ there, docs/robustness.md)."""
    g = torch.Generator().manual_seed(seed)
    keys = shape[-1]
    runs = torch.randint(1, 40, (keys,), generator=g).cumsum(0)
    hidden = (torch.arange(keys)[:, None] >= runs).sum(-1) % 2 == 1
    hidden = hidden ^ (torch.rand(shape, generator=g) < 0.1)
    hidden[..., torch.randint(0, keys, (), generator=g)] = False
    return torch.zeros(shape, dtype=torch.float64).masked_fill(hidden, -torch.inf)


def documents(n: int, base: int) -> torch.Tensor:
    """Ids `base`, `base + 1`, ... of documents of 64, 64, 1, 7 and 40 tokens, again and
    again: whole tiles of QUERY_BLOCK = 32 in one document (where a box decides alone), and
    tiles across several."""
    ends = torch.tensor([64, 64, 1, 7, 40]).repeat(n // 176 + 1).cumsum(0)
    return base + (torch.arange(n)[:, None] >= ends).sum(-1)


def arguments(name: str, sizes: dict, base: int = 0):
    (id_names, added), _ = masks(name)
    spec = checked(name)
    args = sample_arguments(spec, sizes, (), torch.float64, seed=1)
    for each in id_names:
        args[each] = documents(args[each].shape[-1], base)
    for seed, each in enumerate(added):
        args[each] = hiding(args[each].shape, seed)
    given = {k: v for k, v in sizes.items() if k in spec.size_asciis}
    return {k: v.requires_grad_(v.is_floating_point()) for k, v in args.items()}, given


def error(name: str, run, sizes: dict, base: int, monkeypatch) -> float:
    """The largest difference from the literal interpreter, relative to 1 + its largest
    entry, in the outputs and in every gradient of a random projection of them."""
    backend, backward = run
    spec = compiled(name, backend)
    monkeypatch.setattr(rt, "QUERY_BLOCK", SMALL["QUERY_BLOCK"])
    for knob in ("BLOCK_SCORES", "BLOCK_ROWS"):
        if knob in spec.function.__globals__:
            monkeypatch.setitem(spec.function.__globals__, knob, SMALL[knob])
    args, given = arguments(name, sizes, base)
    given = {k: v for k, v in given.items() if k in spec.required}
    got = spec(**args, **given, backward=backward)
    want = reference.evaluate(spec.ir, **args, **given)
    got = got if isinstance(got, tuple) else (got,)
    leaves = [v for v in args.values() if v.requires_grad]
    g = torch.Generator().manual_seed(2)
    weights = [torch.randn(w.shape, generator=g, dtype=w.dtype) for w in want]

    def grads(outs):
        return torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, weights)), leaves)

    pairs = list(zip(got, want)) + list(zip(grads(got), grads(want)))
    assert all(torch.isfinite(b).all() for _, b in pairs)
    return max((a - b).abs().max().item() / (1 + b.abs().max().item()) for a, b in pairs)


def run_id(run) -> str:
    return "-".join(run)


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("run", RUNS, ids=run_id)
@pytest.mark.parametrize("name", WITH_IDS)
def test_integer_ids_beyond_float64_keep_their_mask(name, run, base, monkeypatch):
    assert error(name, run, sizes_for(name, 150, 150), BASES[base], monkeypatch) < 1e-11


@pytest.mark.parametrize("name", WITH_IDS)
def test_twin_ids_read_as_floats_lose_their_mask(name):
    """The ids as float64 made them (2^53 and 2^53 + 1 one document): other outputs, so the
    documents above are told apart by their ids alone."""
    spec = compiled(name)
    args, given = arguments(name, sizes_for(name, 150, 150), 2**53)
    exact = spec(**args, **given)
    for each in masks(name)[0][0]:
        args[each] = args[each].double().long()
    assert (spec(**args, **given) - exact).abs().max() > 1e-3


def lengths():
    """Each spec with each of LENGTHS it admits (one size for queries and keys admits none)."""
    for name in MASKED:
        for case, (n_q, n_k) in LENGTHS.items():
            if sizes_for(name, n_q, n_k):
                yield pytest.param(name, case, id=f"{name}-{case.replace(' ', '_')}")


@pytest.mark.parametrize("run", RUNS, ids=run_id)
@pytest.mark.parametrize(("name", "case"), list(lengths()))
def test_queries_and_keys_of_different_lengths(name, case, run, monkeypatch):
    assert error(name, run, sizes_for(name, *LENGTHS[case]), 0, monkeypatch) < 1e-11


def test_twin_a_mask_one_key_late_is_seen():
    """Against the literal reading of the mask, the generated step given every row's mask one
    key late differs: the comparison above sees where each query's keys are."""
    name = next(n for n in MASKED if masks(n)[0][1] and sizes_for(n, 1, 300))
    spec = compiled(name)
    args, given = arguments(name, sizes_for(name, 1, 300))
    given = {k: v for k, v in given.items() if k in spec.required}
    want = reference.evaluate(spec.ir, **args, **given)[0]
    (added,) = masks(name)[0][1]
    args[added] = args[added].roll(1, -1)
    got = spec(**args, **given)
    assert ((got[0] if isinstance(got, tuple) else got) - want).abs().max() > 1e-3


def test_the_sweep_finds_every_kind_of_tensor_mask():
    """Read from the IR: the integer-id masks, the additive masks of the decode steps and the
    cores, and none where the mask is of positions alone (causal, windows, ALiBi)."""
    assert {"specs/doc_mask.attn", "benchmarks/specs/rope_softcap_doc.attn"} <= set(WITH_IDS)
    assert {"specs/models/llama3_decode.attn", "specs/gqa_core.attn", "specs/nsa.attn"} <= set(
        MASKED
    )
    assert not {"specs/sliding_window.attn", "specs/mha.attn", "specs/alibi.attn"} & set(MASKED)
