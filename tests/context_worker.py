"""One rank of tests/parallel/test_context_parallel.py:
`python context_worker.py RANK WORLD PORT OUT`.

Every check runs a spec module split over its sequence (Ulysses, gloo, CPU, float64) against
the same module in this one process, and writes the largest difference in outputs and in every
gradient (parameters and inputs) under the check's name to OUT/rank{RANK}.json; each twin moves
rank 1's block of one input by 1e-3 and must differ."""

from __future__ import annotations

import copy
import functools
import random
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from distributed_worker import run_checks, start  # this folder is on the path of a script run
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import indexattn
import indexattn.parallel.distributed
import indexattn.parallel.ring
from indexattn.parallel.distributed import CountSent, context_parallel, sequence_block
from indexattn.parallel.sends import ring_sent, ring_sent_ranks
from indexattn.parallel.sequence import CONTIGUOUS, ZIGZAG, ulysses_sent

B, N = 2, 8  # N divides into blocks for 2 and 4 ranks, and into zig-zag chunks for both
CONTEXT = 16  # cross-attention's L, not N: also zig-zag chunks for 4 ranks
DOCS = [0, 0, 0, 1, 1, 2, 2, 2]  # each position's document id (to PADDED, 2 is padding)
WINDOW = 2  # sliding_window's: at 2 ranks, a tile pair holds rows that see none of its keys
# documents of 2 positions, ids near 2^62 (int64; in float64 they would be one number): at 2
# ranks each zig-zag chunk is one document, and no rank reads another's keys
ALIGNED = [2**62 + p // 2 for p in range(N)]


def spec(name: str):
    return indexattn.compile_spec(name)


def whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def gap(a, b) -> float:
    return max([(whole(x) - whole(y)).abs().max().item() for x, y in zip(a, b)] + [0.0])


def inputs(module, context: int = CONTEXT, docs=DOCS) -> dict:
    """Random inputs by name at the module's sizes, the queries' sequence N long and a
    context (cross-attention's L) `context` long; integer inputs are document ids `docs`."""
    g = torch.Generator().manual_seed(3)
    sizes = {**module.sizes, "N": N, "N_q": N, "L": context, "N_kv": context}
    ir_spec = module.spec.ir
    values = {s: sizes[a] for s, a in ir_spec.size_names.items() if a in sizes}
    found = {}
    for t in ir_spec.tensors_of("input"):
        if t.dtype == "int":
            found[t.ascii] = torch.tensor(docs).expand(B, N).contiguous()
            continue
        shape = [int(d.subs(values)) for d in t.shape]
        found[t.ascii] = torch.randn(B, *shape, generator=g)
    return found


def along(module, **where) -> set[str]:
    """The inputs split along the sequence; the others are passed whole on every rank."""
    split = dict(module.spec.sequence_plan(**where).split)
    return {t.ascii for t in module.spec.ir.tensors_of("input") if repr(t) in split}


def run(module, xs: dict, block, split: set[str], move: bool = False, scalars=None):
    """Output and gradients of a weighted sum: params whole, then each input's (this rank's
    block of those in `split`). `block` is the identity in one process; `move` adds 1e-3 to
    the first input's block; `scalars` are given to the call."""
    leaves = {k: (block(v) if k in split else v).clone() for k, v in xs.items()}
    if move:
        first = next(iter(leaves))  # X, or the core's Q
        leaves[first] += 1e-3
    for v in leaves.values():
        v.requires_grad_(v.is_floating_point())
    out = module(**leaves, **(scalars or {}))
    out = out[0] if isinstance(out, tuple) else out  # sdpa returns its weights too
    weight = torch.randn(B, N, *out.shape[2:], generator=torch.Generator().manual_seed(7))
    (out * block(weight.to(out.device))).sum().backward()
    grads = [p.grad for p in module.parameters()]
    grads += [v.grad for v in leaves.values() if v.requires_grad]
    return out, grads


def check(
    mesh, build, twin: bool = False, strategy: str = "ulysses", layout=None, docs=DOCS, **where
) -> dict:
    """The largest differences from one process; the twin moves rank 1's block by 1e-3.
    `layout` is given to both context_parallel and sequence_block (by default, the ring's
    checks run on zig-zag blocks); "default" gives neither. `docs`: the document ids."""
    torch.manual_seed(0)
    module = build().eval().to(mesh.device_type)  # the mesh's card (cuda: this rank's own)
    xs, split = inputs(module, docs=docs), along(module, **where)
    xs = {k: v.to(mesh.device_type) for k, v in xs.items()}
    ring = strategy == "ring"
    if layout is None:
        layout = "zigzag" if ring else "contiguous"
    laid = {} if layout == "default" else {"layout": layout}

    def block(v):
        return sequence_block(v, mesh, dim=1, **laid)

    out1, grads1 = run(copy.deepcopy(module), xs, lambda v: v, split)
    count = len(list(module.parameters()))  # then the float inputs' gradients
    floats = [k for k, v in xs.items() if v.is_floating_point()]
    grads1[count:] = [block(g) if k in split else g for k, g in zip(floats, grads1[count:])]
    parallel = context_parallel(copy.deepcopy(module), mesh, strategy=strategy, **laid, **where)
    out2, grads2 = run(parallel, xs, block, split, move=twin and dist.get_rank() == 1)
    found = {"out": gap([block(out1)], [out2]), "grad": gap(grads1, grads2)}
    if ring:
        found["nan"] = float(bool(out2.isnan().any()) or any(g.isnan().any() for g in grads2))
    return found


CORE = """
index τ, τ' : N
index μ : h
index a : d_k
input Q_<τμa>
input K_<τμa>
input V_<τμa>
M_<ττ'> = where(τ' > τ, -inf, 0)
S_<μττ'> = Q_<τμa> K_<τ'μa> / sqrt(d_k) + M_<ττ'>
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
O_<τμa> = A_<μττ'> V_<τ'μa>
output O
"""  # the attention core alone, heads on the inputs: Ulysses' all-to-all proper


WHOLE = """
index τ, τ' : N
index μ : h
index a : d_k
index i : d_m
input X_<τi>
input g_<μ>
input c_<i>
param W_<(μa)i>
param W_O_<i(μa)>
Z_<τi> = X_<τi> + c_<i>
Q_<μτa> = W_<(μa)i> Z_<τi>
S_<μττ'> = Q_<μτa> Q_<μτ'a> g_<μ> + where(τ' > τ, -inf, 0)
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
O_<μτa> = A_<μττ'> Q_<μτ'a>
Y_<τi> = W_O_<i(μa)> O_<μτa>
output Y
"""  # inputs passed whole beside the split one: a gain per head, a shift read by every head


PADDED = """
index τ, τ' : N
index μ : h
index a : d_k
index i : d_m
input X_<τi>
input P_<τ> : int
param W_<(μa)i>
param W_O_<i(μa)>
Q_<μτa> = W_<(μa)i> X_<τi>
S_<μττ'> = Q_<μτa> Q_<μτ'a> + where(τ' > τ or P_<τ'> == 2, -inf, 0)
A_<μττ'> = softmax_<τ'>(S_<μττ'>)
O_<μτa> = A_<μττ'> Q_<μτ'a>
Y_<τi> = W_O_<i(μa)> O_<μτa>
output Y
"""  # causal, the keys where P is 2 (the last three) padding: key tiles of padding alone, merged
# after the tiles a row sees (doc_mask's rows see no key in a tile merged before others)


def cases() -> dict:
    """Each spec at small sizes, heads divisible by 4 ranks."""
    return {
        "mha": lambda: spec("mha").module(d_m=8, h=4, d_k=3),
        "gqa": lambda: spec("gqa").module(d_m=8, h_kv=4, n_rep=2, d_k=3),
        "sliding_window": lambda: spec("sliding_window").module(
            d_in=8, d_out=12, h=4, d_k=3, w=WINDOW
        ),
        "doc_mask": lambda: spec("doc_mask").module(d_m=8, h=4, d_k=3),
        "softcap_window": lambda: spec("softcap_window").module(
            d_m=8, h=4, d_k=3, c=1.0, w=3, query_pre_attn_scalar=3
        ),
        "attention_sinks": lambda: spec("attention_sinks").module(
            d_m=8, h_kv=4, n_rep=2, d_k=3, w=3
        ),
        "rope": lambda: spec("rope").module(d_m=8, h=4, d_r=2),
        "cross": lambda: spec("cross").module(d_q=8, d_c=6, h=4, d_k=3),
        "linear_attention_causal": lambda: spec("linear_attention_causal").module(
            d_m=8, h=4, d_k=3
        ),
        "retention": lambda: spec("retention").module(d_m=8, h=4, d_k=3),
        "core": lambda: indexattn.compile_spec(CORE, name="core").module(h=4, d_k=3),
        "whole": lambda: indexattn.compile_spec(WHOLE, name="whole").module(d_m=8, h=4, d_k=3),
        "padding": lambda: indexattn.compile_spec(PADDED, name="padding").module(d_m=8, h=4, d_k=3),
    }


def drawn(seed: int):
    """A layer drawn at random from its features (lower/combinations.py), as
    tests/parallel/test_ring_combinations.py draws them."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "lower"))
    from combinations import draw

    layer = indexattn.compile_spec(draw(random.Random(seed)).text, name=f"drawn_{seed}")
    sizes = {"d_m": 8, "h": 2, "h_kv": 2, "n_rep": 2, "d_k": 3, "d_r": 2}
    return layer.module(**{k: v for k, v in sizes.items() if k in layer.ir.size_asciis})


ULYSSES = [*cases()]
# features no shipped spec combines: a prefix, ALiBi, documents and sinks (seed 2); a window
# as a fill, ALiBi, T5 buckets, documents, sinks, grouped heads (8); rotary, a prefix, ALiBi,
# documents, chunks (17); rotary, a window, ALiBi, chunks (30)
DRAWN = {f"drawn_{seed}": functools.partial(drawn, seed) for seed in (2, 8, 17, 30)}
RING_ONLY = {"alibi": lambda: spec("alibi").module(d_in=8, d_out=12, h=4, d_k=3), **DRAWN}
RING = [
    "mha",
    "gqa",
    "sliding_window",
    "alibi",
    "doc_mask",
    "softcap_window",
    "attention_sinks",
    "rope",
    "cross",
    "linear_attention_causal",
    "retention",
    "whole",
    "padding",
    *DRAWN,
]


def ring_work(mesh, build=None) -> dict:
    """A spec's score elements this rank computed and its P2P elements sent in one step, on
    zig-zag blocks, against the schedule (indexattn.parallel.ring.work) and the counts: this
    rank's off the block map (sends.ring_sent_ranks) on zig-zag blocks and, the twin, on
    contiguous ones, and the symbolic one (sends.ring_sent, every key read by every rank: the
    most); mha by default."""
    torch.manual_seed(0)
    module = (build or cases()["mha"])().eval()
    xs = inputs(module)
    parallel = context_parallel(module, mesh, strategy="ring", layout="zigzag")
    run(parallel, xs, lambda v: sequence_block(v, mesh, dim=1, layout="zigzag"), {"X"})
    plan = module.spec.sequence_plan()
    sizes = {**module.sizes, **module.scalars, "N": N}
    schedule = indexattn.parallel.ring.work(module.spec.ir, plan, sizes, mesh.size(), zigzag=True)
    ir_spec, rank, world = module.spec.ir, mesh.get_local_rank(), mesh.size()
    symbols = {s: sizes[a] for s, a in ir_spec.size_names.items()}
    most = sum(
        B * item.at(symbols, world) for item in ring_sent(ir_spec, plan) if item.phase != "gradient"
    )
    symbols |= {s.symbol: sizes[s.ascii] for s in ir_spec.scalars}  # the module's
    counted = {
        layout: B * ring_sent_ranks(ir_spec, plan, symbols, world, layout)[rank]
        for layout in (ZIGZAG, CONTIGUOUS)
    }
    return {
        "work": parallel.last_ring["work"],
        "schedule": schedule[rank],
        "sent": parallel.last_ring["sent"],
        "counted": counted[ZIGZAG],
        "contiguous": counted[CONTIGUOUS],
        "most": most,
    }


def received(mesh, name: str, window: int, docs=None) -> dict:
    """Elements this rank received from each rank in the ring's forward (zig-zag blocks), and
    whether its queries see any key of that other rank under a causal mask `window` positions
    long (0 <= τ - τ' < window), within the documents `docs` where given, by brute force over
    the positions."""
    torch.manual_seed(0)
    module = cases()[name]().eval()
    parallel = context_parallel(module, mesh, strategy="ring", layout="zigzag")
    xs, block = inputs(module, docs=docs or DOCS), functools.partial(sequence_block, mesh=mesh)
    run(parallel, xs, lambda v: block(v, dim=1, layout="zigzag"), along(module))
    held = [
        [p for a, b in spans for p in range(a, b)]
        for spans in indexattn.parallel.ring.chunks(N, mesh.size(), zigzag=True)
    ]
    me = mesh.get_local_rank()
    sees = [
        src != me
        and any(
            0 <= q - k < window and (docs is None or docs[q] == docs[k])
            for q in held[me]
            for k in keys
        )
        for src, keys in enumerate(held)
    ]
    return {"received": parallel.last_ring["received"], "sees": sees}


def runs(mesh, name: str = "mha", layout: str = "zigzag", window: int = N) -> dict:
    """The runs of other ranks' keys this rank received in the ring's kept pass (by default
    mha on zig-zag blocks; tiles of one position; sequence.read_runs), as they are posted,
    the keys of each step its queries read (`window`: the mask's), and the largest difference
    of its output and gradients from one process."""
    torch.manual_seed(0)
    module, found = cases()[name]().eval(), []
    piece = indexattn.parallel.ring._Piece
    posted = piece.__init__

    def recorded(self, *args) -> None:
        posted(self, *args)
        if self.into is not None:
            found.append(list(self.into))

    xs, split = inputs(module), along(module)

    def block(v):
        return sequence_block(v, mesh, dim=1, layout=layout)

    out1, grads1 = run(copy.deepcopy(module), xs, lambda v: v, split)
    grads1[-1] = block(grads1[-1])
    parallel = context_parallel(module, mesh, strategy="ring", layout=layout, tile=1)
    piece.__init__ = recorded
    try:
        out2, grads2 = run(parallel, xs, block, split)
    finally:
        piece.__init__ = posted
    gaps = {"out": gap([block(out1)], [out2]), "grad": gap(grads1, grads2)}
    return {"runs": found, "read": read_keys(mesh, layout, window), **gaps}


def read_keys(mesh, layout: str, window: int) -> list[list[int]]:
    """Each ring step's source's keys (their offsets in its block) that some query of this
    rank sees under a causal mask `window` positions long, by brute force."""
    held = [
        [p for a, b in spans for p in range(a, b)]
        for spans in indexattn.parallel.ring.chunks(N, mesh.size(), zigzag=layout == "zigzag")
    ]
    me, world = mesh.get_local_rank(), mesh.size()
    return [
        [
            n
            for n, k in enumerate(held[(me - s) % world])
            if any(0 <= q - k < window for q in held[me])
        ]
        for s in range(1, world)
    ]


def sent(mesh, build, **where) -> dict:
    """Elements this rank sent in one step, by collective: counted as they ran (CountSent)
    and as indexattn.sequence.ulysses_sent counts them at the same sizes."""
    torch.manual_seed(0)
    module = build().eval().to(mesh.device_type)  # the mesh's card (cuda: this rank's own)
    xs, split = inputs(module), along(module, **where)
    xs = {k: v.to(mesh.device_type) for k, v in xs.items()}
    parallel = context_parallel(module, mesh, **where)
    with CountSent(mesh.size()) as counter:
        run(parallel, xs, lambda v: sequence_block(v, mesh, dim=1), split)
    ir_spec = module.spec.ir
    given = {**module.sizes, "N": N, "N_q": N, "L": CONTEXT, "N_kv": CONTEXT}
    sizes = {s: given[a] for s, a in ir_spec.size_names.items() if a in given}
    counted: dict[str, float] = {}
    for item in ulysses_sent(ir_spec, parallel.spec.sequence_plan(**where)):
        times = 1 if item.phase == "gradient" else B
        counted[item.collective] = counted.get(item.collective, 0) + times * item.at(
            sizes, mesh.size()
        )
    return {"ran": counter.elements, "counted": {k: float(v) for k, v in counted.items()}}


def fsdp_and_sequence(twin: bool, strategy: str = "ulysses") -> float:
    """3 SGD steps of mha on a 2 × 2 mesh, FSDP2 over the batch (dp) and the sequence split
    over cp (Ulysses, or the ring on zig-zag blocks), against one process: the largest
    difference in the state after them. The twin moves rank 1's block of the first batch by
    1e-3."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "cp"))
    torch.manual_seed(0)
    base = spec("mha").module(d_m=8, h=4, d_k=3)
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(4, N, 8, generator=g), torch.randn(4, N, 8, generator=g)) for _ in "abc"]

    def train(module, split, scale: float) -> None:
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        for step, (x, target) in enumerate(data):
            xs, ts = split(x), split(target)
            if twin and step == 0 and dist.get_rank() == 1:
                xs = xs + 1e-3
            loss = (module(xs) - ts).pow(2).sum() / x.numel() * scale
            opt.zero_grad()
            loss.backward()
            opt.step()

    single = copy.deepcopy(base)
    train(single, lambda v: v, 1.0)
    dp = mesh["dp"].get_local_rank()
    ring = strategy == "ring"
    layout = "zigzag" if ring else "contiguous"
    split = context_parallel(copy.deepcopy(base), mesh["cp"], strategy=strategy, layout=layout)
    split = fully_shard(split, mesh=mesh["dp"])
    # FSDP2 averages gradients over dp; each cp group's gradient is its whole block's
    train(split, lambda v: sequence_block(v.chunk(2)[dp], mesh["cp"], dim=1, layout=layout), 2.0)
    return gap(list(single.state_dict().values()), list(split.state_dict().values()))


def heads_and_ring(twin: bool) -> dict:
    """mha on a 2 × 2 mesh: heads split over tp (parallelize), the sequence over cp (ring),
    against one process; the twin moves rank 1's block by 1e-3."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("tp", "cp"))
    torch.manual_seed(0)
    module = cases()["mha"]().eval()
    xs = inputs(module)

    def block(v):
        return sequence_block(v, mesh["cp"], dim=1, layout="zigzag")

    out1, grads1 = run(copy.deepcopy(module), xs, lambda v: v, {"X"})
    grads1[-1] = block(grads1[-1])
    split = indexattn.distributed.parallelize(copy.deepcopy(module), mesh["tp"])
    split = context_parallel(split, mesh["cp"], strategy="ring", layout="zigzag")
    out2, grads2 = run(split, xs, block, {"X"}, move=twin and dist.get_rank() == 1)
    return {"out": gap([block(out1)], [out2]), "grad": gap(grads1, grads2)}


def scalar_per_call(mesh, strategy: str, twin: bool = False) -> dict:
    """softcap_window (built with c = 1) split by Ulysses, the ring or `parallelize` (its
    heads: every rank passes the whole input) and called with c = 2 for this call, against
    one process called so; the twin compares with one process at the module's own c."""
    torch.manual_seed(0)
    module = cases()["softcap_window"]().eval()
    xs, given = inputs(module), {"c": 2.0}
    if strategy == "heads":
        parallel = indexattn.distributed.parallelize(copy.deepcopy(module), mesh)

        def block(v):
            return v
    else:
        parallel = context_parallel(copy.deepcopy(module), mesh, strategy=strategy)

        def block(v):
            return sequence_block(v, mesh, dim=1)

    out1, grads1 = run(copy.deepcopy(module), xs, lambda v: v, {"X"}, scalars={} if twin else given)
    grads1[-1] = block(grads1[-1])
    out2, grads2 = run(parallel, xs, block, {"X"}, scalars=given)
    return {"out": gap([block(out1)], [out2]), "grad": gap(grads1, grads2)}


def mismatch(mesh, strategy: str, given: str) -> str:
    """A layer made for zig-zag blocks called with a block of layout `given`: refused by name
    (contiguous), or run (zig-zag, the twin)."""
    torch.manual_seed(0)
    module = cases()["mha"]().eval()
    parallel = context_parallel(module, mesh, strategy=strategy, layout="zigzag")
    x = inputs(module)["X"]
    return raised(lambda: parallel(sequence_block(x, mesh, dim=1, layout=given)))


LONG = 512  # the bfloat16 checks' sequence: positions past bfloat16's exact integers (256)


def low_precision(mesh, name: str, strategy: str) -> dict:
    """A spec in bfloat16 at N = 512, split (zig-zag blocks) and in one process: each one's
    largest difference from one process in float64 on this rank's rows, and the dtype out."""
    torch.manual_seed(0)
    module = cases()[name]().eval()
    x = torch.randn(1, LONG, 8, generator=torch.Generator().manual_seed(3))
    exact = module(x)
    low = copy.deepcopy(module).to(torch.bfloat16)
    one = low(x.bfloat16())
    parallel = context_parallel(copy.deepcopy(low), mesh, strategy=strategy, layout="zigzag")

    def block(v):
        return sequence_block(v, mesh, dim=1, layout="zigzag")

    split = parallel(block(x.bfloat16()))
    return {
        "one": (block(one).double() - block(exact)).abs().max().item(),
        "split": (split.double() - block(exact)).abs().max().item(),
        "dtype": str(split.dtype),
    }


def raised(call, errors=(ValueError,)) -> str:
    """The message of the error `call()` raises, or "no error"."""
    try:
        call()
    except errors as error:
        return str(error)
    return "no error"


def refused(mesh, name: str, strategy: str = "ulysses", **sizes) -> str:
    module = spec(name).module(**sizes)
    errors = (indexattn.SpecError, ValueError)
    return raised(lambda: context_parallel(module, mesh, strategy=strategy), errors)


def indivisible(mesh, zigzag: bool = False) -> str:
    block = torch.zeros(B, N + 1, 8)  # the spelling zigzag= as well as layout=
    return raised(lambda: sequence_block(block, mesh, dim=1, zigzag=zigzag))


def main() -> None:
    torch.set_default_dtype(torch.float64)
    rank, out, mesh = start()
    world = mesh.size()
    checks = {}
    every = {**cases(), **RING_ONLY}
    for strategy, names in (("ulysses", ULYSSES), ("ring", RING)):
        for name in names:
            prefix = "" if strategy == "ulysses" else "ring_"
            where = {"keys": ("σ",)} if name == "cross" else {}
            for twin in (False, True):
                checks[prefix + name + "_twin" * twin] = functools.partial(
                    check, mesh, every[name], twin, strategy, **where
                )
    checks["ring_work_mha"] = lambda: ring_work(mesh)
    checks["ring_work_attention_sinks"] = lambda: ring_work(  # a window of every key
        mesh,
        lambda: spec("attention_sinks").module(d_m=8, h_kv=4, n_rep=2, d_k=3, w=N),
    )
    for strategy in ("ulysses", "ring", "heads"):
        for twin in (False, True):
            checks[f"scalar_{strategy}" + "_twin" * twin] = functools.partial(
                scalar_per_call, mesh, strategy, twin
            )
    for strategy in ("ulysses", "ring"):
        for twin in (False, True):  # the most natural code: every default
            checks[f"natural_{strategy}" + "_twin" * twin] = functools.partial(
                check, mesh, every["mha"], twin, strategy, "default"
            )
        for given in ("contiguous", "zigzag"):
            checks[f"mismatch_{strategy}_{given}"] = functools.partial(
                mismatch, mesh, strategy, given
            )
    for name in ("mha", "doc_mask", "rope"):  # Ulysses on zig-zag blocks
        for twin in (False, True):
            checks[f"ulysses_zigzag_{name}" + "_twin" * twin] = functools.partial(
                check, mesh, every[name], twin, "ulysses", "zigzag"
            )
    if world == 2:
        for name in ("mha", "rope"):
            for strategy in ("ulysses", "ring"):
                checks[f"bfloat16_{strategy}_{name}"] = functools.partial(
                    low_precision, mesh, name, strategy
                )
    checks["ring_received_sliding_window"] = lambda: received(mesh, "sliding_window", WINDOW)
    checks["ring_received_mha"] = lambda: received(mesh, "mha", N)
    checks["ring_runs"] = lambda: runs(mesh)
    checks["ring_runs_window"] = lambda: runs(mesh, "sliding_window", "contiguous", WINDOW)
    for twin in (False, True):  # document ids near 2^62 that straddle no chunk (2 ranks)
        checks["ring_documents" + "_twin" * twin] = functools.partial(
            check, mesh, every["doc_mask"], twin, "ring", docs=ALIGNED
        )
    checks["ring_received_documents"] = lambda: received(mesh, "doc_mask", N, ALIGNED)
    checks["ring_received_straddling"] = lambda: received(mesh, "doc_mask", N, DOCS)
    checks["sent_mha"] = lambda: sent(mesh, cases()["mha"])
    checks["sent_doc_mask"] = lambda: sent(mesh, cases()["doc_mask"])
    checks["sent_cross"] = lambda: sent(mesh, cases()["cross"], keys=("σ",))
    checks["sent_core"] = lambda: sent(mesh, cases()["core"])
    checks["sent_whole"] = lambda: sent(mesh, cases()["whole"])
    if world == 4:
        checks["fsdp_and_sequence"] = lambda: fsdp_and_sequence(twin=False)
        checks["fsdp_and_sequence_twin"] = lambda: fsdp_and_sequence(twin=True)
        checks["fsdp_and_ring"] = lambda: fsdp_and_sequence(twin=False, strategy="ring")
        checks["fsdp_and_ring_twin"] = lambda: fsdp_and_sequence(twin=True, strategy="ring")
        checks["heads_and_ring"] = lambda: heads_and_ring(twin=False)
        checks["heads_and_ring_twin"] = lambda: heads_and_ring(twin=True)
    checks["alibi_refused"] = lambda: refused(mesh, "alibi", d_in=8, d_out=12, h=4, d_k=3)
    checks["heads_indivisible"] = lambda: refused(mesh, "mha", d_m=6, h=world - 1, d_k=2)
    checks["indivisible"] = lambda: indivisible(mesh)
    checks["indivisible_zigzag"] = lambda: indivisible(mesh, zigzag=True)
    checks["kv_decode_refused"] = lambda: refused(
        mesh, "kv_decode", d_m=8, h=4, d_k=2, strategy="ring"
    )
    run_checks(checks, rank, out)


if __name__ == "__main__":
    main()
