"""Source -> callable: compile once per spec text (kept on disk between processes, see
cache.py), solve sizes once per shape, check every call's shapes with ShapeError (also under
torch.compile, where the checks become guards), keep the per-shape constants, register
generated source for tracebacks."""

from __future__ import annotations

import gc
import hashlib
import linecache
import math
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import catalog
from ..errors import ShapeError
from ..notation.names import ascii_name, normalise
from ..sizes import straight_line
from . import cache
from .cache import Plain

if TYPE_CHECKING:
    import sympy

    from .. import ir
    from ..lower.printers.codegen import Module
    from ..lower.program.program import Program

_CACHE: dict[tuple[str, str, str, type], CompiledSpec] = {}
MAX_SHAPES = 8  # distinct shapes whose sizes and constants a spec keeps
UNROUTED = ("cpu",)  # devices whose calls "auto" runs on the spec's own code, never elsewhere


def compile_spec(
    spec: str | Path,
    name: str | None = None,
    *,
    kind: type[CompiledSpec] | None = None,
    backend: str = "auto",
) -> CompiledSpec:
    """Compile a spec file, a shipped spec or spec text into a callable: a `kind` (this
    module's CompiledSpec, which runs; indexattn.spec's, which also shows itself).

    A `Path`, or a one-line `str` ending in `.attn`, is a file to read; a one-line name such
    as `"mha"` or `"models/llama3"` is the shipped spec of that name (`shipped_specs()` lists
    them); any other `str` is the spec's text.

    >>> spec = compile_spec("index i : n\\ninput x_<i>\\ny_<i> = 2 x_<i>", name="double")
    >>> spec(x=torch.ones(3)).tolist()
    [2.0, 2.0, 2.0]
    >>> compile_spec("gqa").name
    'gqa'

    `backend`: what computes the attention core ("auto", "blocks", "sdpa", "flex", "triton";
    indexattn/backends, docs/backends.md); one that cannot is refused with the reason.
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(
            'compile_spec takes a spec\'s text (str), the name of a shipped spec ("mha") or '
            f"a path (pathlib.Path, or a str ending in .attn), not {type(spec).__name__}"
            + (": decode bytes first, text.decode()" if isinstance(spec, bytes) else "")
        )
    if isinstance(spec, str) and catalog.looks_like_a_name(spec):
        spec = _shipped(spec)
    if isinstance(spec, os.PathLike) or _is_path(spec):
        path = Path(spec)
        text, name, file = _read(path), name or path.stem, str(path)
    else:
        text, name, file = spec, name or "spec", f"<{name or 'spec'}>"
    kind = kind or CompiledSpec
    from ..backends import named

    key = (text, name, file, kind, named(backend))
    if key not in _CACHE:
        _CACHE[key] = _compile(text, name, file, kind, backend)
    return _CACHE[key]


def _compile(
    text: str, name: str, file: str, kind: type[CompiledSpec] | None = None, backend="auto"
):
    """From the disk cache if kept there, else checked, planned and generated (and kept);
    a backend asked for by name is compiled afresh (the disk keeps "auto"'s)."""
    kind = kind or CompiledSpec
    kept = cache.load(text, name, file) if backend == "auto" else None
    if kept is not None:
        return kind(None, text, file, plain=kept)
    from .. import ir

    with _collector_paused():
        compiled = kind(ir.check(text, name, file), text, file, backend=backend)
    if backend == "auto":
        cache.store(text, name, file, compiled.plain)
    return compiled


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a spec compiles, on again after if it was
    on: the compiler keeps what it builds until the end, so a full collection mid-way walks
    every object made so far and frees next to nothing (40 % of the time of a chain of 4,000
    equations, docs/performance.md); what it leaves is collected after."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _shipped(name: str) -> Path:
    try:
        return catalog.shipped(name)
    except LookupError:
        raise catalog.not_a_spec(name) from None


def _value_key(value):
    """A scalar as a cache key: a tensor scalar by itself (held by the key, so its id is not
    reused) and its version, which an in-place write (`w.fill_(100)`, an optimizer's step)
    moves on, so that its constants are built again for the new value."""
    return (value, value._version) if isinstance(value, torch.Tensor) else value


def _no_nan(spec: str, scalars: dict) -> None:
    """Refuse a NaN scalar by name: checked once per kind of eager call, the module's calls too
    (a NaN is never equal to itself, so its calls never repeat a kind); a traced call's scalars
    are symbols (math.isnan cannot be traced), as its other checks are guards."""
    for name, value in scalars.items():
        if isinstance(value, float) and math.isnan(value):
            raise ShapeError(
                f"{spec}: the scalar {name} is NaN: every comparison with NaN is false, "
                "so a mask of it would hide keys the literal reading keeps (or keep keys it "
                f"hides); pass a number, or inf or -inf, for {name}"
            )


def _read(path: Path) -> str:
    """The file's text; a missing file whose name is a shipped spec's says how to get that."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        if path.stem not in catalog.names():
            raise
        raise FileNotFoundError(
            error.errno,
            f"{error.strerror}: {str(path)!r}; the shipped spec {path.stem} is "
            f"compile_spec({path.stem!r})",
        ) from None


def _is_path(text: str) -> bool:
    """A file name: one line ending in .attn (spec text has several lines)."""
    return text.endswith(".attn") and "\n" not in text


class CompiledSpec:
    """A checked spec with its plan and generated module; call it like its function. What it
    shows a person (LaTeX, counts, Markdown) is indexattn.spec's subclass: the runtime does not
    import the views.

    A call reads only `plain`; `ir`, `plan` and `module_source` are built when first asked
    for (by latex, flops, param_count, module, ...) when the spec came from the disk cache."""

    shapes = MAX_SHAPES  # distinct kinds of call (shapes, scalars) kept solved, with constants

    def __init__(
        self,
        spec: ir.Spec | None,
        text: str = "",
        file: str = "<spec>",
        *,
        plain: Plain | None = None,
        backend: str = "auto",
    ) -> None:
        self.text = text  # the spec's source text: what a pickled spec is rebuilt from
        self.file = file
        self.backend = backend  # the attention core's (indexattn/backends)
        if spec is not None:
            self.ir = spec
            self.module_source = _generate(self.program)
            plain = _plain(spec, self.program, self.module_source)
        assert plain is not None, "a CompiledSpec is built from a checked spec or cache entry"
        self.plain = plain
        self.name, self.source = plain.name, plain.source
        namespace = _load(self.source, self.name)
        self.function = namespace[plain.function]
        if backend == "triton":  # the core on the printed kernels, the rest read literally
            self.function = _on_triton(self)
        self.constants_function = namespace[plain.constants] if plain.constants else None
        # Plain attributes, read on every call (and by torch.compile, which cannot trace a lock).
        self.rules, self.positions = plain.rules, plain.positions
        self.required = self.rules.required
        self.size_names = frozenset(plain.sizes)
        self.arguments = plain.arguments
        self._calls: dict = {}  # per kind of call: its sizes and the function's keywords
        self._kinds: dict = {}  # per dtypes, devices, given sizes and scalars: the longs
        self._every_call = self.positions.every_call
        self._constants: dict = {}
        self._checked: dict = {}
        self._lock = threading.Lock()
        self._backends: dict[str, CompiledSpec | None] = {}  # what "auto" runs on a device
        self._routes: dict = {}  # per kind of call and training: which of them runs it

    @cached_property
    def _straight(self):
        """The shape rules as one straight-line function (sizes.straight_line), printed when a
        call of a new shape first asks for it: a spec compiled and never called prints none."""
        return straight_line(self.rules)

    @cached_property
    def ir(self) -> ir.Spec:
        from .. import ir

        return ir.check(self.text, self.name, self.file)

    @cached_property
    def plan(self) -> Program:
        """The planner's program, before the passes."""
        from ..lower.pipeline import pipeline

        return pipeline(self.ir, after="plan", backend=self.backend)

    @cached_property
    def program(self) -> Program:
        """The program after every pass: what the generated module prints."""
        from ..lower.pipeline import pipeline

        return pipeline(self.ir, backend=self.backend)

    @cached_property
    def module_source(self) -> Module:
        return _generate(self.program)

    @property
    def standalone_source(self) -> str:
        """`source` with the runtime it imports (runtime/lib.py) inlined: a module that
        imports nothing of indexattn, and computes what `source` does, bit for bit."""
        from .standalone import standalone

        return standalone(self.source)

    def __reduce__(self):
        # Pickled as its text and kind: generated functions and caches are rebuilt, not stored.
        return partial(compile_spec, kind=type(self), backend=self.backend), (self.text, self.name)

    @property
    def sizes(self) -> tuple[sympy.Symbol, ...]:
        return self.ir.sizes

    def __repr__(self) -> str:
        return f"<indexattn spec {self.name}: {', '.join(self.arguments)}>"

    def __call__(
        self, /, *positional, training: bool = False, backward: str | None = None, **kwargs
    ):
        """Runs the generated function; keywords are tensors, sizes and scalars by ASCII name.
        `backward="derived"`: autograd runs the derived backward (indexattn/derive) instead
        of its own record of the forward; `"autograd"`: its own record; by default, the one
        benchmarks/gradients.py chose for this spec's text (`default_backward`)."""
        if positional:
            raise TypeError(
                f"{self.name}() takes keywords only, and got {len(positional)} positional "
                f"argument(s): write {self.name}({', '.join(f'{a}=...' for a in self.arguments)}"
                f"); it takes {self._signature()}"
            )
        backward = self.default_backward if backward is None else backward
        if backward not in ("autograd", "derived"):
            raise ValueError(f'backward is "autograd" or "derived", not {backward!r}')
        kwargs = self._spelled(kwargs)
        tensors = self._tensors(kwargs)
        given = {k: kwargs.pop(k) for k in list(kwargs) if k in self.size_names}
        scalars = {s: kwargs.pop(s) for s, _ in self.plain.scalars if s in kwargs}
        if kwargs:
            raise TypeError(
                f"{self.name}() got unexpected keywords: {', '.join(kwargs)}; it "
                f"takes {self._signature()}"
            )
        arguments = tuple(tensors.values())
        derived = backward == "derived" and not torch.compiler.is_compiling()  # traced: autograd's
        if derived and self._elsewhere(arguments, given, scalars, training) is None:
            from ..derive.function import run

            return run(self, list(arguments), given, scalars, training)
        return self._run(arguments, given, scalars, training)

    def _elsewhere(self, tensors, given: dict, scalars: dict, training: bool, found=None):
        """The spec compiled with the backend "auto" runs this call on, off a CPU: on CUDA or
        XPU FlexAttention where it takes the spec and the call, else on CUDA the triton kernels
        where they take both (docs/decisions.md, "Backends: what auto chooses"); None: this
        spec's own code (a CPU, a backend named, a call neither runs). Decided once per kind
        of call (`_key`) and training."""
        if self.backend != "auto" or not tensors or tensors[0].device.type in UNROUTED:
            return None
        key = (self._key(tensors, given, scalars), training)
        if key in self._routes:
            return self._routes[key]
        sizes = found[0] if found is not None else self.solve(tensors, given)
        chosen = self._route(sizes, scalars, training, tensors[0].device.type)
        with self._lock:
            _bounded(self._routes, self.shapes)[key] = chosen
        return chosen

    def _route(self, sizes: dict, scalars: dict, training: bool, device: str):
        """`_elsewhere`'s choice for a call's sizes (by ASCII name) and scalars: the backend
        "auto" chooses for the spec, unless every core is on SDPA's fused kernels already or
        the backend refuses the call (then this spec's own code)."""
        from ..backends import BACKENDS, auto

        flex = self._taken("flex")
        fused = BACKENDS["sdpa"].fused(self.program)
        if flex is not None and fused == BACKENDS["flex"].calls(flex.program):
            return None  # every core on SDPA's fused kernels already
        triton = self._taken("triton") if device == "cuda" and flex is None else None
        chosen = {"flex": flex, "triton": triton}.get(
            auto(device, flex is not None, triton is not None)
        )
        if chosen is None:
            return None
        names = self.ir.size_names.items()
        values = {symbol: sizes[name] for symbol, name in names if name in sizes}
        values.update({s.symbol: float(scalars.get(s.ascii, s.value)) for s in self.ir.scalars})
        refuses = BACKENDS[chosen.backend].refuses_call(chosen, values, training, device)
        return None if refuses else chosen

    def _taken(self, backend: str) -> CompiledSpec | None:
        """The spec compiled with `backend`, or None where it cannot take the spec (kept)."""
        from ..backends import Refused

        if backend not in self._backends:
            try:
                self._backends[backend] = self.with_backend(backend)
            except Refused:  # the backend cannot take the spec: today's code
                self._backends[backend] = None
        return self._backends[backend]

    def in_order(self, tensors: Sequence[torch.Tensor], scalars: dict, *, training: bool):
        """`spec(**tensors, **scalars)` for a caller that passes the tensors in argument order
        and only scalars the spec declares (transformers' attention function, at every decode
        step): no keyword respelled or matched by name; sizes, shapes, dtypes and devices are
        checked as in any call."""
        if self.default_backward == "derived" and self.backend != "triton":
            return self(training=training, **dict(zip(self.arguments, tensors)), **scalars)
        return self._run(tensors, {}, scalars, training)

    def _run(self, tensors: Sequence[torch.Tensor], given: dict, scalars: dict, training: bool):
        """The generated function on tensors in argument order, sizes solved and checked. An
        eager call solves and checks once per distinct shapes, dtypes, devices, given sizes and
        scalars, and then looks them up; a traced call every time (the checks become guards)."""
        if torch.compiler.is_compiling():  # traced code builds the constants inline, to be folded
            sizes, widen = self._solve(tensors, given)
            keywords = {name: sizes[name] for name in self.required}
            longs = self._longs(tensors)
        else:
            key = self._key(tensors, given, scalars)
            found = self._calls.get(key)
            if found is None:
                found = self._prepare(key, tensors, given, scalars)
            elif self._every_call:  # positions read from inputs: checked every call
                self.positions.check_arguments(self.name, tensors, found[0])
            elsewhere = self._elsewhere(tensors, given, scalars, training, found)
            if elsewhere is not None:
                return elsewhere._run(tensors, given, scalars, training)
            sizes, keywords, widen, longs = found
        if widen or longs:
            tensors = list(tensors)
            for k, shape in widen:
                tensors[k] = tensors[k].expand(shape)
            for k in longs:  # any integer dtype is read as int64 positions (docs/language.md)
                tensors[k] = tensors[k].long()
        try:
            out = self.function(*tensors, **keywords, **scalars, training=training)
        except (IndexError, RuntimeError, ZeroDivisionError) as error:
            _empty(self.name, sizes, error)
            if isinstance(error, IndexError) and self.positions.computed:  # computed positions
                raise self.positions.failed(self.name, error, sizes) from error
            raise
        return out[0] if self.plain.outputs == 1 and isinstance(out, tuple) else out

    def _key(self, tensors: Sequence[torch.Tensor], given: dict, scalars: dict) -> tuple:
        """A call's kind: the shapes, dtypes and devices, the sizes given, the scalars."""
        return (
            tuple([(t.shape, t.dtype, t.device) for t in tensors]),
            tuple(given.items()),
            tuple(scalars),
            tuple(map(_value_key, scalars.values())),
        )

    def _prepare(self, key: tuple, tensors: Sequence[torch.Tensor], given: dict, scalars: dict):
        """Sizes and the function's keywords for a call of a new kind, every check done. What
        depends on the dtypes, devices, given sizes and scalars alone is checked once for them
        (`_kinds`): a decode step, a new length each, checks only its shapes."""
        kinds = (tuple([entry[1:] for entry in key[0]]), *key[1:])
        longs = self._kinds.get(kinds)
        if longs is None:
            _no_nan(self.name, scalars)
            self._float_rates(scalars)
            self._same_kind(tensors)
            longs = self._longs(tensors)
        shapes = [tuple(t.shape) for t in tensors]
        sizes, widen = None if given else self._straight(shapes), ()  # one batch: no widening
        if sizes is None:  # a size given, batches to widen, or a shape that does not fit
            sizes, widen = self._solve(tensors, given)
        if self._every_call:  # positions read from inputs, or computed
            self.positions.check_arguments(self.name, tensors, sizes)
        keywords = {name: sizes[name] for name in self.required} if self.required else {}
        if self.constants_function is not None:
            keywords["constants"] = self._constants_for(sizes, scalars, tensors[self.plain.like])
        found = (sizes, keywords, widen, longs)
        with self._lock:
            if kinds not in self._kinds:
                _bounded(self._kinds, self.shapes)[kinds] = longs
            _bounded(self._calls, self.shapes)[key] = found
        return found

    def _float_rates(self, scalars: dict) -> None:
        """Refuse by name a dropout probability passed as a tensor (torch's dropout takes a
        float, and a rate has no gradient through the masks it draws)."""
        if not any(isinstance(v, torch.Tensor) for v in scalars.values()):
            return
        from ..derive.reverse import dropouts
        from ..ir import Field, walk

        read = [n for _, d in dropouts(self.ir) for n in walk(d.args[1]) if isinstance(n, Field)]
        rates = {x for n in read for x in n.expr.free_symbols}
        for scalar in self.ir.scalars:
            if scalar.symbol in rates and isinstance(scalars.get(scalar.ascii), torch.Tensor):
                raise TypeError(
                    f"{self.name}: the scalar {scalar.ascii} is a dropout probability, and "
                    f"got a tensor: pass a float ({scalar.ascii}=float(...)); no gradient "
                    "reaches a dropout rate"
                )

    def _constants_for(self, sizes: dict, scalars: dict, like: torch.Tensor) -> tuple:
        """The tensors of positions for these sizes, scalars, device and dtype, built once."""
        values = {**sizes, **dict(self.plain.scalars), **scalars}
        args = tuple(values[name] for name in self.plain.constant_args)
        key = (tuple(_value_key(a) for a in args), like.device, like.dtype)
        found = self._constants.get(key)
        if found is None:  # kept for later calls: never an inference tensor, which autograd
            with torch.inference_mode(False):  # would refuse to save for a backward
                found = self.constants_function(*args, device=like.device, dtype=like.dtype)
            with self._lock:
                _bounded(self._constants, self.shapes)[key] = found
        checked = (key, self.positions.sizes(sizes))  # a table's size is not a constant's
        if checked not in self._checked:
            self.positions.check_constants(self.name, found, sizes)
            with self._lock:
                _bounded(self._checked, self.shapes)[checked] = True
        return found

    def _spelled(self, kwargs: dict) -> dict:
        """Keywords by ASCII name: one that names an argument, size or scalar by the spec's
        own glyphs (`θ=` for the param θ) is that name's ASCII spelling (`theta=`), which
        is what ir/scope.py gave it; both at once is a TypeError."""
        if all(map(str.isascii, kwargs)):  # the common call: nothing to respell, nothing to build
            return kwargs
        known = {*self.arguments, *self.size_names, *(s for s, _ in self.plain.scalars)}
        out = {}
        for key, value in kwargs.items():
            spelled = key if key.isascii() else ascii_name(normalise(key))
            if spelled != key and spelled not in known:
                spelled = key  # not the spec's: said as an unexpected keyword
            if spelled in out:
                raise TypeError(f"{self.name}(): {key} and {spelled} name one argument")
            out[spelled] = value
        return out

    def _tensors(self, kwargs: dict) -> dict[str, torch.Tensor]:
        missing = [name for name in self.arguments if name not in kwargs]
        if missing:
            raise TypeError(
                f"{self.name}() is missing {', '.join(missing)}; it takes {self._signature()}"
            )
        tensors = {name: kwargs.pop(name) for name in self.arguments}
        for name, value in tensors.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"{self.name}(): {name} must be a torch.Tensor, not {type(value).__name__}"
                )
        return tensors

    def _signature(self) -> str:
        names = [*self.arguments, *self.required]
        return ", ".join(names + [f"{s}={value!r}" for s, value in self.plain.scalars])

    def solve(self, tensors: Sequence[torch.Tensor], given: dict) -> dict[str, int]:
        """Sizes by ASCII name, checked against every shape, dtype and device; `tensors` in
        argument order."""
        found, _ = self._solve(tensors, given)
        self._same_kind(tensors)
        return found

    def _solve(self, tensors: Sequence[torch.Tensor], given: dict):
        """Sizes, and the inputs to widen (`_widen`): every shape checked, the batch too."""
        shapes = [tuple(t.shape) for t in tensors]
        return self.rules.solve(shapes, given), self._widen(shapes)

    def _batches(self, shapes: list[tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
        """Each input's leading batch axes, by argument position."""
        return {k: shapes[k][: len(shapes[k]) - rank] for k, rank in self.plain.batch}

    def _batch(self, batches: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
        """The call's batch: the inputs' batch axes (`_batches`) broadcast."""
        full = broadcast(list(batches.values()))
        if full is None:
            listed = ", ".join(f"{self.arguments[k]} {tuple(b)}" for k, b in batches.items())
            raise ShapeError(
                f"{self.name}: the inputs' leading batch axes do not broadcast: {listed}"
            )
        return full

    def _widen(self, shapes: list[tuple[int, ...]]) -> tuple[tuple[int, tuple], ...]:
        """Inputs with fewer or narrower batch axes than the call's, and the shape each is
        expanded to (a view) before the function runs: every step then sees one batch (the
        kernel cannot broadcast queries to a mask's batch, torch.cat a cache to the new keys'
        batch, nor an in-place sum its target)."""
        batches = self._batches(shapes)
        if len(set(batches.values())) <= 1:  # one batch: nothing to widen, nothing to check
            return ()
        full = self._batch(batches)
        return tuple((k, full + shapes[k][len(b) :]) for k, b in batches.items() if b != full)

    def _longs(self, tensors: Sequence[torch.Tensor]) -> tuple[int, ...]:
        """The integer arguments of another integer dtype than int64 (uint8 ids, int16 ...)."""
        pairs = enumerate(zip(self.plain.integer, tensors))
        return tuple(k for k, (integer, t) in pairs if integer and t.dtype != torch.int64)

    def _same_kind(self, tensors: Sequence[torch.Tensor]) -> None:
        first = tensors[self.plain.like]
        dtype, device, like = first.dtype, first.device, self.arguments[self.plain.like]
        for name, integer, t in zip(self.arguments, self.plain.integer, tensors):
            if integer and t.dtype == torch.bool:
                raise ShapeError(
                    f"{self.name}: {name} is torch.bool, but it is declared `: int`: its values "
                    f"are whole numbers (positions, ids), not a mask; pass {name}.long() to read "
                    "True as 1 and False as 0"
                )
            floats = t.is_floating_point() or t.is_complex()
            if floats == integer or (not integer and t.is_complex()):
                raise ShapeError(_kind_error(self.name, name, t, integer, like))
            if t.device != device or (t.dtype != dtype and not integer):
                raise ShapeError(
                    f"{self.name}: {name} is {t.dtype} on {t.device}, but it must be "
                    f"{dtype if not integer else 'an integer tensor'} on {device}, as {like} "
                    "sets; convert them to one dtype and device"
                )

    @cached_property
    def default_backward(self) -> str:
        """The backward a call runs when it names none: "derived" where
        benchmarks/gradients.py measured the derived backward of this spec's text at least as
        fast as autograd's and no larger, else "autograd"."""
        from ..derive.defaults import default

        return "autograd" if self.backend == "triton" else default(self.text)

    def backward_text(self, *, training: bool = True, scalars: frozenset = frozenset()) -> str:
        """The derived backward as spec text: the forward's equations, an input `dY` per
        output (the cotangent of a scalar loss) and an equation for the cotangent of every
        input, param and buffer it reaches (see indexattn/derive and docs/gradients.md), and
        of the `scalars` named (ASCII names). `training=False`: the backward in eval mode,
        where dropout is the identity."""
        from ..derive import backward_text

        return backward_text(self.ir, self.text, self.file, training=training, scalars=scalars)

    def backward(self, *, training: bool = True, scalars: frozenset = frozenset()) -> CompiledSpec:
        """The derived backward, compiled like any spec: call it with the forward's arguments
        and a cotangent per output (`dY=...`); it returns the cotangents `backward().ir.outputs`
        names, each with the call's batch axes (a param's gradient is their sum)."""
        text = self.backward_text(training=training, scalars=scalars)
        return compile_spec(text, name=f"{self.name}_backward", kind=type(self))

    def keeping(self, *, training: bool = True, scalars: frozenset = frozenset()) -> CompiledSpec:
        """The forward that also returns, after its outputs, the values its derived backward
        reads instead of computing them again (`backward="derived"` runs it)."""
        from ..derive import derive

        text = derive(self.ir, self.text, self.file, training=training, scalars=scalars).forward
        return compile_spec(text, name=f"{self.name}_keeping", kind=type(self))

    def shard_plan(self, over: str):
        """Which tensors split along the head index `over` (glyph, macro or ASCII name), which
        are replicated, and which need a relayout first: see indexattn/parallel/shard.py."""
        from ..parallel.shard import shard_plan

        return shard_plan(self.ir, over)

    def sequence_plan(self, over: str = "τ", keys: tuple[str, ...] = (), heads: str | None = None):
        """How the sequence index `over` splits over ranks: which reductions merge by
        log-sum-exp, plain sums or a prefix scan, which positions must be global, and the
        head index Ulysses trades it for: see indexattn/parallel/sequence.py."""
        from ..parallel.sequence import sequence_plan

        return sequence_plan(self.ir, over, keys, heads)

    def module(self, /, *, backend: str | None = None, **kwargs):
        """An nn.Module whose parameters are the spec's params, built at the given sizes;
        `backend`: the attention core's (indexattn/backends), by default this spec's."""
        from .module import SpecModule

        spec = self if backend in (None, self.backend) else self.with_backend(backend)
        return SpecModule(spec, **kwargs)

    def with_backend(self, backend: str) -> CompiledSpec:
        """This spec compiled with another backend for its attention core."""
        return compile_spec(self.text, self.name, kind=type(self), backend=backend)

    def score_mod(self, core: int | None = None, **inputs):
        """FlexAttention's `score_mod` of the spec's attention core, reading the tensors,
        sizes and scalars given by ASCII name (scalars default to the spec's values).

        >>> mod = compile_spec("softcap_core").score_mod(M=torch.zeros(1, 1))
        >>> round(float(mod(torch.tensor(100.0), 0, 0, 0, 0)), 2)
        48.2
        """
        from ..backends.flex import callables

        return callables.score_mod(self.ir, core, **inputs)

    def mask_mod(self, core: int | None = None, **inputs):
        """FlexAttention's `mask_mod` of the spec's attention core (True where a key is seen).

        >>> keep = compile_spec("sliding_window").mask_mod(w=2)
        >>> [bool(keep(0, 0, torch.tensor(5), torch.tensor(k))) for k in (3, 4, 5, 6)]
        [False, True, True, False]
        """
        from ..backends.flex import callables

        return callables.mask_mod(self.ir, core, **inputs)

    def block_mask(self, core: int | None = None, *, BLOCK_SIZE: int = 128, **sizes_and_inputs):
        """The `BlockMask` of the spec's mask at the sizes and inputs given, read off the box
        bounds of its condition (never all N² entries): equal to `create_block_mask` of
        `mask_mod(...)`.

        >>> compile_spec("mha").block_mask(N=512).to_string().count("█")  # causal
        20
        """
        from ..backends.flex import callables

        return callables.block_mask(self.ir, core, BLOCK_SIZE=BLOCK_SIZE, **sizes_and_inputs)


def _kind_error(spec: str, name: str, t: torch.Tensor, integer: bool, like: str) -> str:
    """An integer tensor where floats are declared, or floats where integers are: the kind
    named first, since a dtype alone (int64, float32) does not say which was meant."""
    if integer:
        return (
            f"{spec}: {name} must be an integer tensor (declared `: int`), not "
            f"{_kind(t)} ({t.dtype}); pass integers, e.g. {name}.long()"
        )
    if name == like:
        return (
            f"{spec}: {name} must be a floating tensor, not {_kind(t)} ({t.dtype}): its dtype "
            f"is the call's; convert it, e.g. {name}.float()"
        )
    return (
        f"{spec}: {name} must be a floating tensor, of {like}'s dtype, not {_kind(t)} "
        f"({t.dtype}); convert it, e.g. {name}.to({like}.dtype)"
    )


def _kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "a boolean tensor"
    if t.is_complex():
        return "a complex tensor"
    return "a floating tensor" if t.is_floating_point() else "an integer tensor"


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The shapes broadcast together, or None where they do not, as torch.broadcast_shapes
    says (which imports sympy, through torch.fx, on its first call)."""
    out: list[int] = []
    for axis in range(1, max([0] + [len(shape) for shape in shapes]) + 1):
        sizes = [shape[-axis] for shape in shapes if len(shape) >= axis and shape[-axis] != 1]
        if any(size != sizes[0] for size in sizes[1:]):
            return None
        out.insert(0, sizes[0] if sizes else 1)
    return tuple(out)


def _empty(spec: str, sizes: dict[str, int], error: Exception) -> None:
    """A ShapeError for a call that fails at a size of 0 (a reduction over nothing, a block of
    no rows), which the sizes allow where the mathematics is defined (an empty cache)."""
    empty = [name for name, value in sizes.items() if value == 0]
    if empty:
        raise ShapeError(
            f"{spec}: the size {empty[0]} is 0, and this spec cannot be computed with it "
            f"({type(error).__name__}: {str(error).splitlines()[0]}); give {empty[0]} at least 1"
        ) from error


def _bounded(cache: dict, room: int) -> dict:
    """The cache with room for one more of `room` entries: the oldest goes (call under the
    lock)."""
    while len(cache) >= room:
        cache.pop(next(iter(cache)))
    return cache


def _load(source: str, name: str) -> dict:
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    filename = f"<indexattn {name!r} {digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)  # our own generated code
    return namespace


def _generate(program: Program) -> Module:
    from ..lower.printers.codegen import generate

    return generate(program)


def _plain(spec: ir.Spec, plan: Program, module: Module) -> Plain:
    """What a call needs of a checked spec, its program and generated module, as plain data."""
    from ..ir.shapes import rules
    from .held import layer
    from .positions import positions

    arguments = spec.arguments
    return Plain(
        name=spec.name,
        source=module.text,
        function=module.function,
        constants=module.constants,
        constant_args=module.constant_args,
        rules=rules(spec, plan.sizes),
        positions=positions(plan, module.held),
        arguments=tuple(t.ascii for t in arguments),
        integer=tuple(t.dtype == "int" for t in arguments),
        like=arguments.index(spec.like),
        sizes=tuple(spec.size_asciis),
        scalars=tuple((s.ascii, s.value) for s in spec.scalars),
        outputs=len(spec.outputs),
        batch=tuple((arguments.index(t), len(t.layout)) for t in spec.tensors_of("input")),
        layer=layer(spec),
    )


def _on_triton(spec: CompiledSpec):
    """The generated function's stand-in for backend="triton": the same arguments (tensors
    in order, sizes and scalars by ASCII name), the outputs of `backends.triton.run`."""
    from ..backends import triton

    def function(*tensors, training: bool = False, **keywords):
        return triton.run(
            spec.ir, training=training, **dict(zip(spec.arguments, tensors)), **keywords
        )

    return function
