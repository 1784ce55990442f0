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

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.attn"))


@pytest.fixture(autouse=True)
def directory(tmp_path, monkeypatch):
    monkeypatch.setenv("INDEXATTN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("INDEXATTN_CACHE", raising=False)
    return tmp_path


def fresh(path):
    """The spec at `path` compiled afresh (and kept), then loaded back from the cache."""
    text, name, file = path.read_text(encoding="utf-8"), path.stem, str(path)
    miss = compiled._compile(text, name, file)
    hit = compiled._compile(text, name, file)
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
    env = {**os.environ, "INDEXATTN_CACHE_DIR": str(directory)}
    command = [sys.executable, "-c", script, str(ROOT / "specs" / "mha.attn")]
    runs = [
        subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT) for _ in range(2)
    ]
    assert [r.stdout.split() for r in runs] == [["True", "True"], ["False", "False"]]
