"""Every kind of spec mistake: its exact message (place, quoted line, caret, hint) is golden.

The corpus is tests/errors/NAME.attn with the expected message in NAME.txt; docs/errors.md
is generated from the same files.
"""

from pathlib import Path

import pytest

import indexattn

ERRORS = sorted((Path(__file__).resolve().parents[1] / "errors").glob("*.attn"))
PAGE = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def errors_page() -> str:
    """docs/errors.md: every error with the smallest spec that makes it, and its message."""
    out = [
        "# Every spec error, with a spec that makes it",
        "",
        "Generated from `tests/errors/` by `python tests/notation/test_errors.py`; the test suite",
        "fails when this page is stale. Each message names the place, quotes the line, puts",
        "a caret under the mistake and says what to write instead.",
        "",
    ]
    for path in ERRORS:
        message = path.with_suffix(".txt").read_text(encoding="utf-8").rstrip("\n")
        headline = message.splitlines()[0].split(" error: ", 1)[-1]
        out += [
            f"## {headline}",
            "",
            "```",
            path.read_text(encoding="utf-8").rstrip("\n"),
            "```",
            "",
            "```",
            message,
            "```",
            "",
        ]
    return "\n".join(out)


@pytest.mark.parametrize("path", ERRORS, ids=[p.stem for p in ERRORS])
def test_error_message_is_golden(path):
    with pytest.raises(indexattn.SpecError) as caught:
        indexattn.compile_spec(path.read_text(encoding="utf-8"), name=path.stem)
    assert str(caught.value) + "\n" == path.with_suffix(".txt").read_text(encoding="utf-8")


def test_errors_page_is_current():
    assert PAGE.read_text(encoding="utf-8") == errors_page()


def test_the_corpus_covers_every_required_kind():
    # SPEC_LANGUAGE.md, "Errors": each of these must be caught.
    required = {
        "undeclared_index",
        "undeclared_tensor",
        "range_mismatch",
        "literal_out_of_range",
        "used_before_definition",
        "defined_twice",
        "index_once",
        "lhs_missing",
        "softmax_not_free",
        "unknown_function",
        "unclosed_group",
        "unclosed_paren",
        "unclosed_subscript",
    }
    assert required <= {p.stem for p in ERRORS}


def test_a_file_spec_error_names_the_file(tmp_path):
    path = tmp_path / "broken.attn"
    path.write_text("index i : n\ninput x_<i>\ny_<i> = x_<j>\n", encoding="utf-8")
    with pytest.raises(indexattn.SpecError) as caught:
        indexattn.compile_spec(path)
    assert str(caught.value).startswith(f"{path}:3:12: error: index j is not declared")
    assert caught.value.span.line == 3 and caught.value.span.col == 12


def test_spec_errors_and_shape_errors_share_one_root():
    assert issubclass(indexattn.SpecError, indexattn.IndexAttnError)
    assert issubclass(indexattn.ShapeError, indexattn.IndexAttnError)


if __name__ == "__main__":
    PAGE.write_text(errors_page(), encoding="utf-8")
