"""Every rank of a split layer called alike, checked before anything is sent.

Ranks called differently compute what no one process would (a scalar given on one rank
alone), or wait for one another for ever (a block of another length or dtype, a rank that
refused its own call while the others went on into the ring). Each rank describes its call
(`described`: the inputs' shapes, dtypes and devices, the scalars, train or eval) with its own
refusal, if any; one all-gather of a fingerprint of that per call, and where the
fingerprints differ, one of the descriptions themselves: every rank then raises the same
error, naming what differs on which ranks (docs/distributed.md, "Every rank called alike").
A rank's own refusal of a block cut for another layout or mesh is `block_refused`'s."""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

ALIKE = (
    "every rank of a split layer takes inputs of the same shapes, dtypes and devices (each "
    "its own block of the sequence, a whole input the same tensor), the same scalars and the "
    "same mode (train or eval)"
)


def described(given: dict, scalars: dict, training: bool, whole=()) -> dict[str, str]:
    """A call by what the ranks must agree on, printable: each input's shape, dtype and
    device, each scalar's value, the mode, and the values of the inputs named in `whole`
    (the same tensor on every rank: `sampled`)."""
    found = {}
    for name, value in given.items():
        if isinstance(value, torch.Tensor):
            dtype = str(value.dtype).removeprefix("torch.")
            found[name] = f"{tuple(value.shape)} {dtype} on {value.device.type}"
    for name, value in scalars.items():
        found[name] = repr(float(value))
    found["mode"] = "training" if training else "eval"
    for name in whole:
        if isinstance(given.get(name), torch.Tensor):
            found[f"{name}'s values"] = f"sampled {sampled(given[name]):016x}"
    return found


SAMPLES = 2**12  # the elements of a whole input that `sampled` reads, evenly spaced


def sampled(t: torch.Tensor) -> int:
    """A digest of up to SAMPLES of t's elements, evenly spaced, by their bits: each byte
    times an odd weight by its place, summed modulo 2^64 where t is. Equal tensors give equal
    digests on every rank; tensors that differ throughout (another batch, another seed)
    differ in it, one changed element may not (a read of every element would cost as much
    as a layer's projections)."""
    flat = t.detach().reshape(-1)
    flat = flat[:: max(1, flat.numel() // SAMPLES)].contiguous()
    words = flat.view(torch.uint8).to(torch.int64)
    odd = torch.arange(words.numel(), dtype=torch.int64, device=words.device) * 2 + 1
    return int((words * odd).sum()) % 2**64


def agree(name: str, mesh, call: dict[str, str], refused: str | None, whose="layer") -> None:
    """Return where every rank of `mesh` described its call as `call` and refused nothing;
    else raise, on every rank, the same ValueError: the lowest rank's refusal, or what
    differs (`name`: the spec's or model's, `whose` what it is, for the message)."""
    mine = (call, refused)
    digest = hashlib.blake2b(repr(mine).encode(), digest_size=8).digest()
    number = int.from_bytes(digest, "little", signed=True)
    fingerprint = torch.tensor([number], device=mesh.device_type)  # NCCL: this rank's card
    group, world = mesh.get_group(), mesh.size()
    every = [torch.empty_like(fingerprint) for _ in range(world)]
    dist.all_gather(every, fingerprint, group=group)
    if bool((torch.cat(every) == number).all()):
        if refused is not None:  # every rank refused its call alike
            raise ValueError(refused)
        return
    calls: list = [None] * world
    dist.all_gather_object(calls, mine, group=group)
    raise ValueError(disagreement(name, calls, whose))


def disagreement(name: str, calls: list[tuple[dict, str | None]], whose="layer") -> str:
    """The error for ranks whose calls (`calls[r]`: rank r's description and refusal)
    differ: the lowest rank's refusal with the ranks that refused, else the first thing
    described that differs, with its value on each rank."""
    refusing = [(r, message) for r, (_, message) in enumerate(calls) if message is not None]
    if refusing:
        ranks = [r for r, _ in refusing]
        return f"{refusing[0][1]} (on {_ranks(ranks)}; every rank of the {whose} raises this)"
    keys = list(dict.fromkeys(k for call, _ in calls for k in call))
    key = next(k for k in keys if len({call.get(k) for call, _ in calls}) > 1)
    by_value: dict = {}
    for r, (call, _) in enumerate(calls):
        by_value.setdefault(call.get(key, "not given"), []).append(r)
    values = ", ".join(f"{value} on {_ranks(ranks)}" for value, ranks in by_value.items())
    return f"{name}: the ranks were called differently, {key}: {values}; {ALIKE}"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def block_refused(name: str, given: dict, keys, layout, mesh, whose="layer") -> str | None:
    """Why a split layer (or model, `whose`) on `mesh` refuses, by name, a block that
    `sequence_block` cut in another layout than `layout`, or for another rank or mesh size
    (a block made otherwise carries none, and is taken as this rank's); None: none refused."""
    here = (mesh.get_local_rank(), mesh.size())
    for key in keys:
        cut = getattr(given.get(key), "_sequence_cut", None)
        if cut is not None and cut.layout != layout:
            return (
                f"{name}: {key} is a {cut.layout} block (sequence_block(..., "
                f"layout={cut.layout.name!r})), and this {whose} was split for {layout} "
                f"blocks: pass layout={layout.name!r} to sequence_block, or split the {whose} "
                f"with layout={cut.layout.name!r}"
            )
        if cut is not None and (cut.rank, cut.world) != here:
            return (
                f"{name}: {key} was cut for rank {cut.rank} of {cut.world} (sequence_block on "
                f"another mesh), and this is rank {here[0]} of the {here[1]} ranks the {whose} "
                f"was split over: cut every block with the mesh the {whose} was split over (of "
                "a 2-D mesh, its sequence dimension: sequence_block(x, mesh['cp'], dim=1))"
            )
    return None
