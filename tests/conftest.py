"""Shared fixtures: the shipped specs, compiled once per session, with a compile cache in a
temporary directory; the masks the kernel is called with."""

import os
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
def saving(monkeypatch):
    """patch(namespace): a generated module's `by_blocks` runs its blocks through autograd's
    own steps, every block's scores and weights saved and none made again (the twin of a
    step that recomputes them)."""
    import torch

    def patch(namespace: dict) -> None:
        pieces = namespace["pieces"]

        def by_blocks(block, spans, tensors, cuts, dim=-2, draws=False):
            return torch.cat([block(*s, *pieces(tensors, cuts, s)) for s in spans], dim)

        monkeypatch.setitem(namespace, "by_blocks", by_blocks)

    return patch
