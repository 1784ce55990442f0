"""Running the printed kernels: the source loaded once per core (Triton's JIT on a GPU, its
interpreter on a CPU), the launches, and the autograd function whose backward is the printed
backward. The operands are 4-D [batch, head, position, width] tensors of any strides; a load
is a 4-D [batch, query head, query, key] view (stride 0 where it does not vary)."""

from __future__ import annotations

import functools
import hashlib
import linecache

import sympy
import torch

from .emit import Kernels

BLOCK = 16  # rows and keys per program: Triton's least for tl.dot; the interpreter's tests
# cross block edges fast at it (the GPU script names its own)


@functools.lru_cache(maxsize=64)
def _functions(source: str, interpret: bool) -> dict:
    """The kernels of `source`, each made a Triton function; the text is registered with
    linecache so that Triton reads it back as it reads a file."""
    if interpret:
        _interpreting()
    import triton

    filename = f"<indexattn-triton-{hashlib.sha1(source.encode()).hexdigest()[:12]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        wrap = InterpretedFunction
    else:
        wrap = triton.jit
    return {n: wrap(f) for n, f in namespace.items() if n.startswith("attention_")}


def _interpreting() -> None:
    """Triton's interpreter, which reads TRITON_INTERPRET when triton is first imported: set
    here if nothing imported it yet, else it must have been set before."""
    import os
    import sys

    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    import triton

    if not triton.knobs.runtime.interpret:
        raise RuntimeError(
            "the triton backend runs on a CPU in Triton's interpreter: set TRITON_INTERPRET=1 "
            "before triton is first imported (torch.compile imports it too)"
        )


def functions(kernels: Kernels, device: torch.device) -> dict:
    return _functions(kernels.source, device.type == "cpu")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


class Launch:
    """One call's shapes and fixed arguments: the constants (from the sizes and scalars), the
    loads, the block sizes."""

    def __init__(
        self,
        kernels: Kernels,
        q,
        k,
        v,
        sink,
        loads,
        values: dict,
        block: int = BLOCK,
        splits: int = 1,
        params: bool = False,
    ):
        self.kernels, self.q, self.k, self.v, self.sink, self.loads = kernels, q, k, v, sink, loads
        self.params = params  # the backward gives the loads' and scalars' gradients too
        self.fns = functions(kernels, q.device)
        self.B, self.H, self.N_Q, self.D = q.shape
        self.HK, self.N_K, self.DV = k.shape[1], k.shape[2], v.shape[3]
        self.block, self.splits = block, splits
        self.acc = _acc(q.dtype)
        self.constants = [_number(expr, values) for _, expr in kernels.constants]

    def tail(self) -> list:
        """The arguments after the operands: the sink, the loads, the constants, the sizes."""
        args: list = []
        if self.sink is not None:
            args += [self.sink, *self.sink.stride()[:3]]
        for load in self.loads:
            args += [load, *load.stride()]
        args += self.constants
        args += [self.H, self.HK, self.N_Q, self.N_K, self.D, self.DV, self.H // self.HK]
        return args

    def run(self, name: str, grid, operands: list, extra: tuple = (), **constexprs) -> None:
        flat = []
        for t in operands:
            flat += [t, *t.stride()]
        b = self.block
        self.fns[name][grid](
            *flat,
            *extra,
            *self.tail(),
            BLOCK_M=b,
            BLOCK_N=b,
            BLOCK_D=_pow2(self.D),
            BLOCK_DV=_pow2(self.DV),
            ACC=self.acc,
            **constexprs,
        )

    def rows_grid(self):
        return (_cdiv(self.N_Q, self.block), self.B * self.H)

    def keys_grid(self):
        return (_cdiv(self.N_K, self.block), self.B * self.HK)

    @property
    def softmax(self) -> bool:
        return self.kernels.core.normaliser == "softmax"

    def forward(self, o, lse) -> None:
        self.run(
            "attention_forward",
            self.rows_grid(),
            [self.q, self.k, self.v, o, *([lse] if self.softmax else [])],
        )

    def split_forward(self, o, lse, splits: int) -> None:
        """Split-K (decoding: few queries, many keys): `splits` programs per block of rows,
        each the keys of one chunk (whole blocks), their partial sums combined in order."""
        chunk = _cdiv(_cdiv(self.N_K, splits), self.block) * self.block
        splits = _cdiv(self.N_K, chunk)
        dtype = launch_dtype(self.q)
        part = self.q.new_empty((self.B * splits, self.H, self.N_Q, self.DV), dtype=dtype)
        stats = [
            self.q.new_empty((self.B * splits, self.H, self.N_Q), dtype=dtype)
            for _ in range(2 if self.softmax else 0)
        ]
        grid = (*self.rows_grid(), splits)
        operands = [self.q, self.k, self.v, part, *stats]
        self.run("attention_forward_split", grid, operands, extra=(splits, chunk))
        by_chunk = [t.unflatten(0, (self.B, splits)) for t in (part, *stats)]
        combine(*by_chunk, o=o, lse=lse)

    def params_buffers(self):
        """Where attention_dq writes the graded loads' gradients (per element, zero where a
        block is skipped) and the scalars' (per row): (dloads, dscalars)."""
        graded, scalars = len(self.kernels.graded), len(self.kernels.scalars)
        dtype, bh = launch_dtype(self.q), self.B * self.H
        dloads = self.q.new_zeros((graded, bh, self.N_Q, self.N_K), dtype=dtype)
        return dloads, self.q.new_empty((scalars, bh, self.N_Q), dtype=dtype)

    def backward(self, o, lse, do, dq, dk, dv, delta, dsink, params=None) -> None:
        """dq, dk, dv (and dsink); `params`: the buffers of `params_buffers`, or None."""
        stats = [lse, delta] if self.softmax else []
        if self.softmax:
            pre = [o, do, delta, *([lse, dsink] if self.sink is not None else [])]
            self.run("attention_preprocess", self.rows_grid(), pre)
        self.run("attention_dkdv", self.keys_grid(), [self.q, self.k, self.v, do, dk, dv, *stats])
        dloads, dscalars = params if params is not None else (dq, delta)  # unread without
        extra = (dloads, *dloads.stride(), dscalars, *dscalars.stride())
        operands = [self.q, self.k, self.v, do, dq, *stats]
        self.run("attention_dq", self.rows_grid(), operands, extra, PARAMS=params is not None)


def combine(part, top=None, total=None, *, o, lse) -> None:
    """The chunks' partial sums [B, S, H, N_Q, DV] as one output (and its logsumexp): each
    chunk's scaled by exp(its max - the max), in chunk order (deterministic)."""
    if top is None:  # sigmoid: the sums add
        o.copy_(part.sum(1))
        return
    most = top.amax(1, keepdim=True)
    most = torch.where(most == -torch.inf, torch.zeros_like(most), most)
    scale = torch.exp(top - most)
    total = (total * scale).sum(1)
    safe = torch.where(total == 0, torch.ones_like(total), total)
    o.copy_((part * scale[..., None]).sum(1) / safe[..., None])
    lse.copy_(torch.where(total == 0, torch.inf, most[:, 0] + torch.log(safe)))


def _acc(dtype: torch.dtype):
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def _number(expr: sympy.Expr, values: dict):
    value = expr.subs(values)
    if not value.is_number:
        raise ValueError(f"the triton backend: no value for {sorted(map(str, value.free_symbols))}")
    return int(value) if value.is_integer else float(value)


class Attention(torch.autograd.Function):
    """O from q, k, v, the sink's logits ([B, H, N_Q] broadcast), the loads ([B, H, N_Q,
    N_K] views) and the scalars the score reads (tensors, or floats without gradient); its
    backward launches the printed backward kernels."""

    @staticmethod
    def forward(ctx, launch: Launch, q, k, v, sink, *params):
        o = q.new_empty((*q.shape[:3], v.shape[3]))
        lse = q.new_empty(q.shape[:3], dtype=launch_dtype(q))
        if launch.splits > 1:
            launch.split_forward(o, lse, launch.splits)
        else:
            launch.forward(o, lse)
        ctx.launch, ctx.params = launch, params
        ctx.save_for_backward(o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        launch: Launch = ctx.launch
        o, lse = ctx.saved_tensors
        q, k, v = launch.q, launch.k, launch.v
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        delta = torch.empty_like(lse)
        dsink = torch.empty_like(lse) if launch.sink is not None else None
        buffers = launch.params_buffers() if launch.params else None
        launch.backward(o, lse, do.contiguous(), dq, dk, dv, delta, dsink, buffers)
        return None, dq, dk, dv, dsink, *_params_grads(launch, ctx.params, buffers)


def _params_grads(launch: Launch, params: tuple, buffers) -> list:
    """Each load's gradient (its graded buffer, as the load's view) and each scalar's (its
    rows' partials summed in order), None for what needs none."""
    n = len(launch.loads)
    if buffers is None:
        return [None] * len(params)
    dloads, dscalars = buffers
    graded = list(launch.kernels.graded)
    grads = []
    for (_, load), value in zip(launch.kernels.loads, params[:n]):
        j = graded.index(load) if load in graded else None
        grads.append(None if j is None else dloads[j].view(value.shape).to(value.dtype))
    for j, value in enumerate(params[n:]):
        keep = isinstance(value, torch.Tensor) and value.requires_grad
        grads.append(dscalars[j].sum().reshape(value.shape).to(value.dtype) if keep else None)
    return grads


def launch_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32
