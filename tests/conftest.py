"""Shared fixtures: the shipped specs, compiled once per session."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.attn"))


@pytest.fixture(params=SPECS, ids=[p.stem for p in SPECS])
def shipped(request):
    import indexattn

    return indexattn.compile_spec(request.param)
