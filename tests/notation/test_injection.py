"""A spec is data: Python placed anywhere in it is never executed, and the generated module
always parses."""

import ast

import pytest
import torch

import indexattn

PAYLOAD = "__import__('os').system('touch /tmp/indexattn-pwned')"

HOSTILE = [
    # a title, a description and declaration comments with code and line breaks
    f"# title \"\"\" ''' \\\n# {PAYLOAD}\n# \u2028{PAYLOAD}\u2029 \u202e{PAYLOAD}\n"
    'index i : n  # """\n' + f"input x_<i>  # \\\n# {PAYLOAD}\ny_<i> = x_<i>\n",
    # a comment on an equation that tries to end the line
    f"index i : n\ninput x_<i>\ny_<i> = x_<i>  # \r{PAYLOAD} \x0c{PAYLOAD}\n",
]

REJECTED = [
    f"index i : n\ninput x_<i>\ny_<i> = x_<i> + {PAYLOAD}\n",  # code in an expression
    f"index i : n\ninput x_<i>\nscalar p = {PAYLOAD}\ny_<i> = p x_<i>\n",  # in a scalar
    "index i : n\ninput x_<i>\ny_<i> = x_<i> ; import os\n",  # a statement separator
    "index i : n\ninput x_<i>\ny_<i> = x_<i> + 1e999999\n",  # a number too large
    "index i : n\ninput x_<i>\ny_<i> = exec(x_<i>)\n",  # a call to a Python builtin
    "index i : n\ninput x\u0000_<i>\ny_<i> = x_<i>\n",  # NUL in a name
    "index i : n\ninput x_<i>\ny_<i> = x_<i> \u202e+ 1\n",  # a bidi control in code
]


@pytest.fixture(autouse=True)
def no_marker(tmp_path):
    import os

    marker = "/tmp/indexattn-pwned"
    if os.path.exists(marker):
        os.remove(marker)
    yield
    assert not os.path.exists(marker), "a spec executed code"


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_comments_stay_comments(text):
    spec = indexattn.compile_spec(text, name="hostile")
    ast.parse(spec.source)
    assert "\u2028" not in spec.source and "\u202e" not in spec.source
    assert spec(x=torch.ones(3)).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("text", REJECTED)
def test_code_in_the_spec_is_a_spec_error(text):
    with pytest.raises(indexattn.SpecError):
        indexattn.compile_spec(text, name="hostile")


@pytest.mark.parametrize(
    "name",
    [
        "import",
        "lambda",
        "torch",
        "F",
        "math",
        "einsum",
        "rearrange",
        "training",
        "print",
        "__class__",
    ],
)
def test_names_that_are_python_words_are_mangled(name):
    text = f"index i : n\ninput {name}_<i>\nparam b_<i>\ny_<i> = {name}_<i> + b_<i>\n"
    spec = indexattn.compile_spec(text, name="words")
    ast.parse(spec.source)
    arg = spec.ir.tensors[0].ascii
    assert arg != name or name == "__class__"
    assert spec(**{arg: torch.ones(2), "b": torch.ones(2)}).tolist() == [2.0, 2.0]


def test_spec_name_is_mangled():
    spec = indexattn.compile_spec(
        "index i : n\ninput x_<i>\ny_<i> = x_<i>", name="os.system('x'); y"
    )
    ast.parse(spec.source)
    assert spec(x=torch.ones(1)).tolist() == [1.0]


def test_numbers_are_reprinted_from_their_values():
    spec = indexattn.compile_spec(
        "index i : n\ninput x_<i>\ny_<i> = 0.1000000000000000055511 x_<i> + 10", name="n"
    )
    assert "0.1000000000000000055511" not in spec.source
    assert "x * 0.1" in spec.source and ".add_(10)" in spec.source
    assert spec(x=torch.ones(2, dtype=torch.float64)).tolist() == [10.1, 10.1]
