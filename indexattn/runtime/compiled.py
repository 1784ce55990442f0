"""Source -> callable and nn.Module: compile once per spec text, solve sizes once per shape,
check every call's shapes with ShapeError, register generated source for tracebacks."""

from __future__ import annotations

import hashlib
import linecache
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import sympy
import torch
from torch import nn

from .. import ir
from ..errors import ShapeError
from ..ir.shapes import solve, whole
from ..lower.codegen import generate
from ..lower.plan import Plan, plan
from ..notation.names import ascii_name
from ..views import cost

_CACHE: dict[tuple[str, str, str], CompiledSpec] = {}


def compile_spec(spec: str | Path, name: str | None = None) -> CompiledSpec:
    """Compile a spec file or text into a callable.

    >>> spec = compile_spec("index i : n\\ninput x_<i>\\ny_<i> = 2 x_<i>", name="double")
    >>> spec(x=torch.ones(3)).tolist()
    [2.0, 2.0, 2.0]
    """
    if isinstance(spec, Path) or (isinstance(spec, str) and spec.endswith(".attn")):
        path = Path(spec)
        text, name, file = path.read_text(encoding="utf-8"), name or path.stem, str(path)
    else:
        text, name, file = spec, name or "spec", f"<{name or 'spec'}>"
    key = (text, name, file)
    if key not in _CACHE:
        _CACHE[key] = CompiledSpec(ir.check(text, name, file))
    return _CACHE[key]


@dataclass(eq=False)
class CompiledSpec:
    """A checked spec with its plan and generated module; call it like its function."""

    ir: ir.Spec
    plan: Plan = field(init=False)
    source: str = field(init=False)
    _shapes: dict = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.plan = plan(self.ir)
        self.source = generate(self.plan)
        self.function = _load(self.source, self.ir.name)
        # Plain attributes, read on every call (and by torch.compile, which cannot trace the
        # lock of a cached_property).
        self.required = tuple(self.ir.size_ascii(s) for s in self.plan.sizes.required)
        self.size_names = frozenset(self.ir.size_asciis)
        self.arguments = tuple(t.ascii for t in self.ir.arguments)

    @property
    def name(self) -> str:
        return self.ir.name

    @property
    def sizes(self) -> tuple[sympy.Symbol, ...]:
        return self.ir.sizes

    def __repr__(self) -> str:
        return f"<indexattn spec {self.name}: {', '.join(t.ascii for t in self.ir.arguments)}>"

    def __call__(self, *, training: bool = False, **kwargs):
        """Runs the generated function; keywords are tensors, sizes and scalars by ASCII name."""
        tensors = self._tensors(kwargs)
        given = {k: kwargs.pop(k) for k in list(kwargs) if k in self.size_names}
        scalars = {s.ascii: kwargs.pop(s.ascii) for s in self.ir.scalars if s.ascii in kwargs}
        if kwargs:
            raise TypeError(
                f"{self.name}() got unexpected keywords: {', '.join(kwargs)}; it "
                f"takes {self._signature()}"
            )
        return self._run(tuple(tensors.values()), given, scalars, training)

    def _run(self, tensors: Sequence[torch.Tensor], given: dict, scalars: dict, training: bool):
        """The generated function on tensors in argument order, sizes solved and checked."""
        # Shapes are checked by eager calls; a compiled graph calls the function directly.
        sizes = given if torch.compiler.is_compiling() else self.solve(tensors, given)
        required = {name: sizes[name] for name in self.required}
        out = self.function(*tensors, **required, **scalars, training=training)
        return out[0] if len(self.ir.outputs) == 1 and isinstance(out, tuple) else out

    def _tensors(self, kwargs: dict) -> dict[str, torch.Tensor]:
        missing = [t.ascii for t in self.ir.arguments if t.ascii not in kwargs]
        if missing:
            raise TypeError(
                f"{self.name}() is missing {', '.join(missing)}; it takes {self._signature()}"
            )
        tensors = {t.ascii: kwargs.pop(t.ascii) for t in self.ir.arguments}
        for name, value in tensors.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"{self.name}(): {name} must be a torch.Tensor, not {type(value).__name__}"
                )
        return tensors

    def _signature(self) -> str:
        names = [t.ascii for t in self.ir.arguments] + list(self.required)
        return ", ".join(names + [f"{s.ascii}={s.value!r}" for s in self.ir.scalars])

    def solve(self, tensors: Sequence[torch.Tensor], given: dict) -> dict[str, int]:
        """Sizes by ASCII name, solved once per distinct shapes and given sizes; `tensors` in
        argument order."""
        key = (tuple([t.shape for t in tensors]), tuple(given.items()))
        if key not in self._shapes:
            shapes = {name: tuple(t.shape) for name, t in zip(self.arguments, tensors)}
            values = solve(self.ir, self.plan.sizes, shapes, given)
            self._batch(shapes)
            self._shapes[key] = {self.ir.size_ascii(s): v for s, v in values.items()}
        self._same_kind(tensors)
        return self._shapes[key]

    def _batch(self, shapes: dict[str, tuple[int, ...]]) -> None:
        batches = {
            t.ascii: shapes[t.ascii][: len(shapes[t.ascii]) - len(t.layout)]
            for t in self.ir.tensors_of("input")
        }
        try:
            torch.broadcast_shapes(*batches.values())
        except RuntimeError:
            listed = ", ".join(f"{name} {tuple(b)}" for name, b in batches.items())
            raise ShapeError(
                f"{self.name}: the inputs' leading batch axes do not broadcast: {listed}"
            ) from None

    def _same_kind(self, tensors: Sequence[torch.Tensor]) -> None:
        first_name, first = self.arguments[0], tensors[0]
        dtype, device = first.dtype, first.device
        for name, t in zip(self.arguments, tensors):
            if t.dtype != dtype or t.device != device:
                raise ShapeError(
                    f"{self.name}: {name} is {t.dtype} on {t.device}, but "
                    f"{first_name} is {first.dtype} on {first.device}; convert "
                    "them to one dtype and device"
                )

    def param_count(self) -> sympy.Expr:
        """Learnable numbers in the size symbols, e.g. 4*d_m**2 + d_m."""
        return cost.param_count(self.ir)

    def flops(self) -> sympy.Expr:
        """Floating-point operations of one forward pass per batch element, along the steps
        the generated code takes (see indexattn/cost.py for what each step costs)."""
        return cost.flops(self.plan)

    def latex(self, *, raised: bool = False, sums: bool = False) -> str:
        r"""The equations as an amsmath `align` environment; `raised=True` writes a contracted
        index up on its second use (`X_{\tau}{}^{i}`), `sums=True` writes the sums."""
        from ..views import latex

        return latex.latex(self.ir, raised=raised, sums=sums)

    def _repr_latex_(self) -> str:
        from ..views import latex

        return "$$" + latex.latex(self.ir, environment="aligned") + "$$"

    def _repr_markdown_(self) -> str:
        from ..views import markdown as docs

        return docs.head(self.ir, index=False) + "\n" + docs.equations(self.ir, docs.NOTEBOOK_MATH)

    def module(self, **kwargs) -> SpecModule:
        """An nn.Module whose parameters are the spec's params, built at the given sizes."""
        return SpecModule(self, **kwargs)


def _load(source: str, name: str):
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    filename = f"<indexattn {ascii_name(name)} {digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)  # our own generated code
    return namespace[ascii_name(name)]


class SpecModule(nn.Module):
    """The spec as a layer: params become nn.Parameters, buffers are registered."""

    def __init__(self, spec: CompiledSpec, **kwargs) -> None:
        super().__init__()
        self.spec = spec
        ir_spec = spec.ir
        size_names = {v: k for k, v in ir_spec.size_names.items()}
        self.sizes = {
            k: whole(spec.name, k, kwargs.pop(k)) for k in list(kwargs) if k in size_names
        }
        values = {size_names[k]: v for k, v in self.sizes.items()}
        for tensor in ir_spec.tensors_of("buffer"):
            data = kwargs.pop(tensor.ascii, None)
            self.register_buffer(
                tensor.ascii,
                data if data is not None else torch.zeros(_shape(tensor, values, spec.name)),
            )
        for tensor in ir_spec.tensors_of("param"):
            shape = _shape(tensor, values, spec.name)
            param = nn.Parameter(torch.empty(shape))
            _initialise(param, tensor, fan_in(ir_spec, tensor, values))
            self.register_parameter(tensor.ascii, param)
        for scalar in ir_spec.scalars:
            setattr(self, scalar.ascii, float(kwargs.pop(scalar.ascii, scalar.value)))
        if kwargs:
            raise TypeError(f"{spec.name}.module() got unexpected keywords: {', '.join(kwargs)}")
        self._inputs = tuple(t.ascii for t in ir_spec.tensors_of("input"))
        self._scalars = tuple(s.ascii for s in ir_spec.scalars)
        # each argument of the function: the position of an input, or the name of a tensor held
        self._order = tuple(
            self._inputs.index(t.ascii) if t.role == "input" else t.ascii for t in ir_spec.arguments
        )

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        spec = self.spec
        if not kwargs and len(args) == len(self._inputs) and all(map(_is_tensor, args)):
            # The common call, in few Python steps: its cost is per call, like a kernel launch.
            params = self._parameters
            tensors = [
                args[k] if isinstance(k, int) else params[k] if k in params else getattr(self, k)
                for k in self._order
            ]
            scalars = {name: getattr(self, name) for name in self._scalars}
            return spec._run(tensors, self.sizes, scalars, self.training)
        return self._forward(args, kwargs)

    def _forward(self, args: tuple, kwargs: dict):
        """Inputs by keyword, and wrong calls: every check of the spec's own call."""
        inputs = [t.ascii for t in self.spec.ir.tensors_of("input")]
        if len(args) > len(inputs):
            raise TypeError(
                f"{self.spec.name} takes {len(inputs)} inputs ({', '.join(inputs)}),"
                f" got {len(args)}"
            )
        kwargs.update(zip(inputs, args))
        for tensor in self.spec.ir.tensors_of("param", "buffer"):
            kwargs[tensor.ascii] = getattr(self, tensor.ascii)
        scalars = {s.ascii: getattr(self, s.ascii) for s in self.spec.ir.scalars}
        return self.spec(training=self.training, **self.sizes, **scalars, **kwargs)

    def extra_repr(self) -> str:
        return f"spec={self.spec.name}, " + ", ".join(f"{k}={v}" for k, v in self.sizes.items())


def _is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def _shape(tensor: ir.Tensor, values: dict, name: str) -> tuple[int, ...]:
    shape = [s.subs(values) for s in tensor.shape]
    missing = sorted({str(x) for s in shape for x in s.free_symbols})
    if missing:
        raise TypeError(
            f"{name}.module() needs the size{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} to build {tensor!r}: pass "
            + ", ".join(f"{ascii_name(m)}=..." for m in missing)
        )
    return tuple(int(s) for s in shape)


def fan_in(spec: ir.Spec, tensor: ir.Tensor, values: dict) -> int:
    """nn.Linear's in_features: the size of a param's axes that its product sums over; a param
    summed over nothing (a bias) takes the fan-in of a weight in its equation, as nn.Linear's
    bias does."""
    for eq in spec.equations:
        if all(ref.tensor != tensor for ref in ir.refs(eq.rhs)):
            continue
        fans = [
            (f.tensor, set(p.summed) & set(f.tensor.indices))
            for p in _products(eq.rhs)
            for f in p.factors
            if isinstance(f, ir.Ref) and f.tensor.role == "param"
        ]
        own = [fan for t, fan in fans if t == tensor and fan]
        known = [_size(fan, values) for _, fan in fans if fan and _known(fan, values)]
        return _size(own[0], values) if own else max(known, default=1)
    return 1


def _known(indices: set[ir.Index], values: dict) -> bool:
    return all(s in values for i in indices for s in i.size.free_symbols)


def _size(indices: set[ir.Index], values: dict) -> int:
    return int(sympy.Mul(*(i.size for i in indices)).subs(values))


def _products(node: ir.Node):
    if isinstance(node, ir.Product):
        yield node
    for child in ir.children(node):
        yield from _products(child)


def _initialise(param: nn.Parameter, tensor: ir.Tensor, fan: int) -> None:
    init = tensor.init
    with torch.no_grad():
        if init is None:
            bound = 1 / math.sqrt(fan) if fan > 0 else 0.0
            nn.init.uniform_(param, -bound, bound)
        elif init.kind == "normal":
            nn.init.normal_(param, *init.args)
        elif init.kind == "uniform":
            nn.init.uniform_(param, *init.args)
        else:
            nn.init.constant_(param, 0.0 if init.kind == "zeros" else 1.0)
