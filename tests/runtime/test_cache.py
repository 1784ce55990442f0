"""The compile cache on disk (indexattn/runtime/cache.py): a spec loaded from it behaves as the
spec compiled afresh, in a directory of each test's own (never the user's)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from indexattn import ShapeError
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import cache, compiled
from indexattn.spec import CompiledSpec

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.attn"))


@pytest.fixture(autouse=True)
def directory(tmp_path, monkeypatch):
    monkeypatch.setenv("INDEXATTN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("INDEXATTN_CACHE", raising=False)
    return tmp_path


def fresh(path):
    """The spec at `path` compiled afresh (and kept), then loaded back from the cache."""
    text, name, file = path.read_text(encoding="utf-8"), path.stem, str(path)
    miss = compiled._compile(text, name, file, CompiledSpec)  # the kind that shows itself too
    hit = compiled._compile(text, name, file, CompiledSpec)
    return miss, hit


def outputs(spec, arguments, given):
    out = spec(**arguments, **given)
    return out if isinstance(out, tuple) else (out,)


def failures(spec, arguments: dict, given: dict) -> list[str | None]:
    """The ShapeError of a call with no axes in the first argument, then of calls with one
    argument's last axis a position short (None where that shape still fits)."""
    wrong = [{**arguments, spec.arguments[0]: torch.zeros(())}]
    wrong += [{**arguments, name: value[..., :-1]} for name, value in arguments.items()]
    found = []
    for call in wrong:
        try:
            spec(**call, **given)
            found.append(None)
        except ShapeError as error:
            found.append(str(error))
    return found


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_a_cached_spec_runs_as_the_spec_compiled_afresh(path):
    miss, hit = fresh(path)
    assert "ir" in vars(miss) and "ir" not in vars(hit)  # the hit skipped the checker
    assert hit.source == miss.source and hit.plain == miss.plain
    sizes = sample_sizes(miss.ir, seed=0)
    given = {k: v for k, v in sizes.items() if k in miss.required}
    arguments = sample_arguments(miss.ir, sizes, (2,), torch.float64, seed=0)
    for got, want in zip(outputs(hit, arguments, given), outputs(miss, arguments, given)):
        assert torch.equal(got, want)
    other = sample_arguments(miss.ir, sizes, (2,), torch.float64, seed=1)  # the twin
    assert any(
        not torch.equal(got, want)
        for got, want in zip(outputs(hit, other, given), outputs(miss, arguments, given))
    )
    assert failures(hit, arguments, given) == failures(miss, arguments, given)
    assert failures(miss, arguments, given)[0].startswith(f"{miss.name}: ")  # rank: always
    assert hit.flops() == miss.flops() and hit.latex() == miss.latex()  # built when asked


def test_a_changed_spec_text_misses(directory):
    text = "index i : n\ninput x_<i>\ny_<i> = 2 x_<i>\n"
    compiled._compile(text, "double", "<double>")
    assert cache.load(text, "double", "<double>") is not None
    assert cache.load(text.replace("2 x", "3 x"), "double", "<double>") is None
    tripled = compiled._compile(text.replace("2 x", "3 x"), "double", "<double>")
    assert tripled(x=torch.ones(2)).tolist() == [3.0, 3.0]
    assert len(list(directory.glob("*.pickle"))) == 2


@pytest.mark.parametrize("garbage", [b"", b"not a pickle", b"\x80\x05N."])
def test_a_corrupt_entry_is_compiled_again_and_rewritten(directory, garbage):
    text = "index i : n\ninput x_<i>\ny_<i> = 2 x_<i>\n"
    compiled._compile(text, "double", "<double>")
    (entry,) = directory.glob("*.pickle")
    entry.write_bytes(garbage)
    assert cache.load(text, "double", "<double>") is None
    spec = compiled._compile(text, "double", "<double>")
    assert spec(x=torch.ones(2)).tolist() == [2.0, 2.0]
    assert cache.load(text, "double", "<double>") == spec.plain  # rewritten


def test_the_cache_turned_off_keeps_nothing(directory, monkeypatch):
    monkeypatch.setenv("INDEXATTN_CACHE", "0")
    compiled._compile("index i : n\ninput x_<i>\ny_<i> = 2 x_<i>\n", "double", "<double>")
    assert not list(directory.iterdir())
    monkeypatch.setenv("INDEXATTN_CACHE", "1")  # the twin
    compiled._compile("index i : n\ninput x_<i>\ny_<i> = 2 x_<i>\n", "double", "<double>")
    assert list(directory.glob("*.pickle"))


def test_a_process_compiling_a_cached_spec_imports_no_sympy(directory):
    script = (
        "import sys, indexattn; indexattn.compile_spec(sys.argv[1]); "
        "print('sympy' in sys.modules, 'indexattn.ir' in sys.modules)"
    )
    runs = twice(script, directory)
    assert [r.stdout.split() for r in runs] == [["True", "True"], ["False", "False"]]


# spec.module(...) on a cache hit: built from the entry's plain data, never from the IR.
MODULES = SPECS + sorted((ROOT / "specs" / "models").glob("*.attn"))


def built(spec, sizes: dict, seed: int = 0):
    torch.manual_seed(seed)
    return spec.module(**sizes).eval()


def ran(module, inputs: list) -> tuple:
    with torch.no_grad():
        out = module(*inputs)
    return out if isinstance(out, tuple) else (out,)


def refusal(spec, sizes: dict) -> str | None:
    """The TypeError of spec.module(**sizes), or None where it builds."""
    try:
        spec.module(**sizes)
    except TypeError as error:
        return str(error)
    return None


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_a_module_built_on_a_cache_hit_is_the_module_built_afresh(path):
    miss, hit = fresh(path)
    sizes = sample_sizes(miss.ir, seed=0)
    got, want = built(hit, sizes), built(miss, sizes)
    assert "ir" not in vars(hit)  # the hit built its module with no IR
    arguments = sample_arguments(miss.ir, sizes, (2,), torch.float32, seed=0)
    held = {k: v for k, v in arguments.items() if k not in want._inputs}  # shaped by sympy
    kinds = {k: (v.shape, v.dtype) for k, v in held.items()}
    assert {k: (v.shape, v.dtype) for k, v in want.state_dict().items()} == kinds
    assert {k: (v.shape, v.dtype) for k, v in got.state_dict().items()} == kinds
    for key, value in want.state_dict().items():
        assert torch.equal(got.state_dict()[key], value)
    inputs = [arguments[name] for name in want._inputs]
    for a, b in zip(ran(got, inputs), ran(want, inputs)):
        assert torch.equal(a, b)
    if held:  # the twin: other sizes, other shapes
        other = built(hit, {k: v + 1 for k, v in sizes.items()})
        assert any(other.state_dict()[k].shape != v.shape for k, v in want.state_dict().items())


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_a_module_refused_on_a_cache_hit_is_refused_in_the_same_words(path):
    miss, hit = fresh(path)
    sizes = sample_sizes(miss.ir, seed=0)
    calls = [{k: v for k, v in sizes.items() if k != left} for left in sizes]  # one size short
    calls += [{}, {**sizes, "nonsense": 1, "also_not": 2}]
    found = [refusal(hit, call) for call in calls]
    assert found == [refusal(miss, call) for call in calls]
    assert "ir" not in vars(hit)
    assert found[-1] == f"{miss.name}.module() got unexpected keywords: nonsense, also_not"
    if miss.plain.layer.params or miss.plain.layer.buffers:  # the twin: all sizes given
        assert refusal(hit, sizes) is None and found[-2].startswith(f"{miss.name}.module() needs")


def test_a_changed_initialiser_in_the_spec_text_is_a_changed_module():
    path = ROOT / "specs" / "mha.attn"
    text = path.read_text(encoding="utf-8")
    assert text.count("normal(0, 0.02)") == 2
    sizes = {"d_m": 16, "h": 2, "d_k": 8}
    compiled._compile(text, "mha", str(path))
    declared = built(compiled._compile(text, "mha", str(path)), sizes)  # a hit
    wider = text.replace("normal(0, 0.02)", "normal(0, 0.5)")
    compiled._compile(wider, "mha", str(path))
    changed = built(compiled._compile(wider, "mha", str(path)), sizes)  # a hit of the change
    assert declared.W.std() < 0.05 < 0.3 < changed.W.std()
    assert torch.equal(changed.W, built(compiled._compile(wider, "mha", str(path)), sizes).W)


TWO_WEIGHTS = """index i : n
index j : m
index k : ν
input x_<i>
input z_<k>
param W_<ji>
param U_<jk>
param b_<j>
y_<j> = W_<ji> x_<i> + U_<jk> z_<k> + b_<j>
"""


def test_a_bias_after_two_weights_takes_the_larger_known_fan_in_on_a_hit():
    miss = compiled._compile(TWO_WEIGHTS, "two", "<two>")
    hit = compiled._compile(TWO_WEIGHTS, "two", "<two>")
    assert "ir" not in vars(hit)
    wide = {"n": 4, "m": 300, "nu": 100}  # b's fan-in: the larger of n and ν, 100
    assert torch.equal(built(hit, wide).b, built(miss, wide).b)
    assert 0.09 < built(hit, wide).b.abs().max() <= 0.1
    narrow = built(hit, {**wide, "nu": 1})  # the twin: fan-in n = 4, bound 1/2
    assert 0.45 < narrow.b.abs().max() <= 0.5
    message = refusal(hit, {"n": 4, "m": 300})  # a size named as the spec writes it
    assert message == refusal(miss, {"n": 4, "m": 300}) and "ν=..." in message


def test_a_process_building_a_module_of_a_cached_spec_imports_no_sympy(directory):
    script = (
        "import sys, torch, indexattn; spec = indexattn.compile_spec(sys.argv[1]); "
        "layer = spec.module(d_m=16, h=2, d_k=8); y = layer(torch.randn(2, 5, 16)); "
        "print(tuple(y.shape), 'sympy' in sys.modules, 'indexattn.ir' in sys.modules)"
    )
    runs = twice(script, directory)
    assert [r.stdout.split(")")[1].split() for r in runs] == [["True", "True"], ["False", "False"]]
    assert [r.stdout.split(")")[0] for r in runs] == ["(2, 5, 16"] * 2


def broadcasts(shapes) -> tuple | None:
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None


def test_batch_axes_broadcast_as_torch_says_with_no_sympy():
    cases = [[(2,), (3, 1)], [(2,), (3,)], [(), (4, 5)], [(4, 1), (1, 5), (5,)], [(4, 2), (4, 3)]]
    cases += [[(0,), (1,)], [(0,), (2,)], [(2, 1, 3), (5, 3)], [(2, 1, 3), (5, 2)], []]
    found = [compiled.broadcast(shapes) for shapes in cases]
    assert found == [broadcasts(shapes) for shapes in cases]
    assert None in found and (3, 2) in found


def twice(script: str, directory) -> list[subprocess.CompletedProcess]:
    """The script on specs/mha.attn in two fresh processes sharing one cache: a miss, a hit."""
    env = {**os.environ, "INDEXATTN_CACHE_DIR": str(directory)}
    command = [sys.executable, "-c", script, str(ROOT / "specs" / "mha.attn")]
    return [
        subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT) for _ in range(2)
    ]
