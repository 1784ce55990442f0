"""The shipped specs by name: `indexattn.shipped("mha")`, `shipped_specs()` and
`compile_spec("mha")`; a string that is no file, no shipped name and no spec text is told
what was tried (golden messages)."""

from pathlib import Path

import pytest

import indexattn
from indexattn import catalog

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "specs").rglob("*.attn"))


def test_every_shipped_spec_is_listed_with_its_title():
    listed = indexattn.shipped_specs()
    assert list(listed) == sorted(p.relative_to(ROOT / "specs").with_suffix("").as_posix()
                                  for p in FILES)  # fmt: skip
    assert listed["mha"] == "Causal multi-head self-attention, one fused head-major projection"
    assert listed["models/llama3"].startswith("Llama 3's attention layer")
    assert all(listed.values())  # every shipped spec has a title


def test_a_name_is_the_shipped_file():
    assert indexattn.shipped("mha") == ROOT / "specs" / "mha.attn"  # in a checkout
    assert indexattn.shipped("models/gpt2") == ROOT / "specs" / "models" / "gpt2.attn"
    assert indexattn.shipped("gpt2") != indexattn.shipped("models/gpt2")


def test_compile_spec_takes_a_shipped_name():
    by_name = indexattn.compile_spec("gqa")
    assert by_name.name == "gqa"
    assert by_name.source == indexattn.compile_spec(ROOT / "specs" / "gqa.attn").source
    assert indexattn.compile_spec("models/llama3").name == "llama3"
    assert indexattn.compile_spec("mqa").source != by_name.source  # the twin: another name


def test_the_package_data_wins_where_a_wheel_installed_it(tmp_path, monkeypatch):
    packaged = tmp_path / "indexattn"
    (packaged / "specs").mkdir(parents=True)
    (packaged / "specs" / "only.attn").write_text("# Only\nindex i : n\n", encoding="utf-8")
    monkeypatch.setattr(catalog.resources, "files", lambda package: packaged)
    assert catalog.names() == ["only"] and indexattn.shipped_specs() == {"only": "Only"}


def test_a_string_that_is_nothing_says_what_was_tried():
    with pytest.raises(indexattn.SpecError) as caught:
        indexattn.compile_spec("mha2")
    assert str(caught.value) == (
        "<spec>: error: 'mha2' is not a file, a shipped spec or spec text\n"
        "  compile_spec tried it as\n"
        "  - a file: only a pathlib.Path or a str ending in .attn is read as one\n"
        "  - a shipped spec: none is called 'mha2' (did you mean 'mha'?); "
        "indexattn.shipped_specs() names them all\n"
        "  - spec text: a spec declares and defines on several lines"
    )


def test_an_unknown_shipped_name():
    with pytest.raises(LookupError) as caught:
        indexattn.shipped("nope")
    assert str(caught.value) == (
        "'nope' is not a shipped spec; did you mean 'rope'? indexattn.shipped_specs() "
        "(or `indexattn list`) names them all"
    )
    with pytest.raises(LookupError):
        indexattn.shipped("../specs/mha")  # a name, never a path out of the folder


def test_a_missing_file_named_like_a_shipped_spec_points_to_it(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        indexattn.compile_spec(str(tmp_path / "specs" / "mha.attn"))
    assert str(caught.value).endswith("; the shipped spec mha is compile_spec('mha')")
    with pytest.raises(FileNotFoundError) as other:
        indexattn.compile_spec(str(tmp_path / "mine.attn"))
    assert "shipped" not in str(other.value)


def test_one_line_of_spec_text_is_still_read_as_spec_text():
    with pytest.raises(indexattn.SpecError, match=r"<spec>:1:1: error: expected a decl"):
        indexattn.compile_spec("y_<i> x_<i>")  # not a name: read as spec text, and refused
