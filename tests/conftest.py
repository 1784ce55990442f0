"""Shared fixtures: the shipped specs, compiled once per session, with a compile cache in a
temporary directory; the masks the kernel is called with."""

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# Hypothesis draws the same examples on every run (a CI run never fails on a new draw that the
# last one did not make); HYPOTHESIS_PROFILE=explore draws new ones (docs/testing.md).
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The stages' folders (tests/notation, tests/ir, ...) on the path as tests/ itself is: a test
# reads another's helpers by the file's name (`from test_differential import specs`), whichever
# folder either is in, and in whatever order pytest collects them.
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(d) for d in sorted(HERE.iterdir()) if any(d.glob("test_*.py"))]

# The compile cache of this run (and of the processes it starts): never the user's own.
os.environ["INDEXATTN_CACHE_DIR"] = tempfile.mkdtemp(prefix="indexattn-cache-")
# inductor's too: its default, /tmp/torchinductor_<user>, is shared by every torch on the
# machine, and torch 2.9 aborted in a kernel that a newer torch had left there (CI runs the
# oldest and newest releases' suites side by side)
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="indexattn-inductor-")
# Triton's interpreter runs the triton backend's kernels on a CPU (tests/test_triton_backend.py):
# Triton reads this once, when first imported (by inductor too), so it is set before anything
# can import it; never where a GPU is, whose inductor tests compile Triton for it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.attn"))


# The slow tier, which the quick one (`pytest -m "not slow"`, docs/testing.md) leaves out: a
# sweep over the shipped specs but for mha (a test parametrized by a shipped spec, by the
# `shipped` fixture or by its name or path in the test's id: the quick tier keeps one spec of
# each sweep), every test that starts processes (the ranks of a launch), and the tests and
# files marked `@pytest.mark.slow` (or `pytestmark = pytest.mark.slow`) themselves.
QUICK_SPEC = "mha"
SLOW_FIXTURES = frozenset({"ranks", "launched"})
SHIPPED = frozenset(
    name
    for path in (ROOT / "specs").rglob("*.attn")
    for name in (str(path.relative_to(ROOT / "specs").with_suffix("")), path.stem)
) - {QUICK_SPEC}


def swept(item) -> bool:
    """Whether the test is one of a sweep over the shipped specs, other than mha's."""
    given = getattr(item, "callspec", None)
    if given is None:
        return False
    if "shipped" in given.params:
        return given.params["shipped"].stem != QUICK_SPEC
    parts = {p.removeprefix("specs/") for p in given.id.split("-")}
    return bool(parts & SHIPPED)


def pytest_collection_modifyitems(items):
    for item in items:
        if swept(item) or SLOW_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=SPECS, ids=[p.stem for p in SPECS])
def shipped(request):
    import indexattn

    return indexattn.compile_spec(request.param)


@pytest.fixture
def masks(monkeypatch) -> list:
    """The attn_mask of every call of the kernel while the test runs."""
    import torch.nn.functional as F

    seen: list = []
    kernel = F.scaled_dot_product_attention

    def record(*args, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return kernel(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", record)
    return seen


@pytest.fixture(autouse=True)
def default_dtype():
    """Every test starts at torch's default float32 and leaves it there: a test (or a library
    it calls) that sets another default changes no later test's modules."""
    import torch

    torch.set_default_dtype(torch.float32)
    yield
    torch.set_default_dtype(torch.float32)


@pytest.fixture
def saving():
    """`with saving():` the runtime's `by_blocks` runs its blocks through autograd's own steps
    (`each_block`), every block's scores and weights saved and none made again (the twin of
    a step that recomputes them)."""
    from indexattn.runtime import lib as rt

    def plain(block, spans, tensors, cuts, dim=-2, draws=False):
        return rt.each_block(block, spans, tensors, cuts, dim)

    @contextlib.contextmanager
    def patched():
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(rt, "by_blocks", plain)
            yield

    return patched
