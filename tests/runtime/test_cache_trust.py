"""The compile cache as a trust boundary: an entry is unpickled (code), so the directory is
made 0700, entries load only from a directory and files this user owns and no one else can
write (else compiled afresh, said once), and a failed write leaves no temporary file."""

import builtins
import os
import pickle
import warnings
from pathlib import Path

import pytest

from indexattn.runtime import cache, compiled

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "specs/mha.attn").read_text(encoding="utf-8")
KEY = (TEXT, "mha", "mha.attn")


class Planted:
    """What another user could leave in a shared cache: unpickling it runs code."""

    def __reduce__(self):
        return (exec, ("import builtins; builtins._indexattn_planted = True",))


@pytest.fixture
def directory(tmp_path, monkeypatch):
    where = tmp_path / "cache"
    monkeypatch.setenv("INDEXATTN_CACHE_DIR", str(where))
    monkeypatch.delenv("INDEXATTN_CACHE", raising=False)
    yield where
    if hasattr(builtins, "_indexattn_planted"):
        del builtins._indexattn_planted


def plant(directory: Path) -> Path:
    """A compiled entry, then replaced by another user's pickle."""
    compiled._compile(*KEY)
    (entry,) = directory.glob("*.pickle")
    entry.write_bytes(pickle.dumps(Planted()))
    return entry


def test_the_directory_is_made_private_whatever_the_umask(directory):
    old = os.umask(0)
    try:
        compiled._compile(*KEY)
    finally:
        os.umask(old)
    assert directory.stat().st_mode & 0o777 == 0o700


def test_a_world_writable_cache_is_not_loaded_and_said_once(directory):
    entry = plant(directory)
    directory.chmod(0o777)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert cache.load(*KEY) is None
        assert cache.load(*KEY) is None
        spec = compiled.compile_spec(*KEY[:2])
    assert not hasattr(builtins, "_indexattn_planted")
    assert spec.name == "mha" and entry.read_bytes() == pickle.dumps(Planted())  # not rewritten
    assert len([w for w in said if "not private" in str(w.message)]) == 1


def test_twin_a_private_cache_loads_its_entry(directory):
    """The same planted entry in a private directory is unpickled: the check above is what
    stops it."""
    plant(directory)
    directory.chmod(0o700)
    assert cache.load(*KEY) is None  # not a Plain: ignored, but it was unpickled
    assert builtins._indexattn_planted


def test_a_group_writable_entry_is_not_loaded(directory):
    entry = plant(directory)
    entry.chmod(0o666)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cache.load(*KEY) is None
    assert not hasattr(builtins, "_indexattn_planted")


def test_a_failed_write_leaves_no_temporary_file(directory, monkeypatch):
    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    for _ in range(3):
        compiled._compile(*KEY)
    assert list(directory.iterdir()) == []


def test_twin_a_write_that_succeeds_leaves_one_entry(directory):
    compiled._compile(*KEY)
    assert [p.suffix for p in directory.iterdir()] == [".pickle"]
