"""The parser: every construct of the v1 language, spans, spellings and line continuation."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import indexattn
from indexattn.errors import Span
from indexattn.notation import parse, syntax
from indexattn.notation.names import ascii_name
from indexattn.notation.printer import equation

MHA_GREEK = """index τ, τ' : N
index i : d_m
index μ : h
index a : d_k
input X_<τi>
param W_<(μa)i>
Q_<μτa> = W_<(μa)i> X_<τi>
"""


def test_title_description_and_declaration_comments():
    doc = parse(
        "# Title here\n#\n# First line\n# second line\n\nindex i : n  # width\n"
        "input x_<i>  # the data\ny_<i> = x_<i>  # copy\n",
        "t",
    )
    assert doc.title == "Title here"
    assert doc.description == "First line\nsecond line"
    index, tensor, eq = doc.statements
    assert (index.doc, tensor.doc, eq.doc) == ("width", "the data", "copy")


def test_continuation_rules():
    text = (
        "index i : n\ninput x_<i>\ninput y_<i>\n"
        "z_<i> = x_<i>\n     + y_<i>\n"  # next line starts with an operator
        "w_<i> = x_<i> *\n  y_<i>\n"  # line ends with an operator
        "v_<i> = where(x_<i> > 0,\n  x_<i>,\n  y_<i>)\n"
    )  # open bracket
    doc = parse(text, "c")
    assert [equation(s) for s in doc.statements[3:]] == [
        "z_<i> = x_<i> + y_<i>",
        "w_<i> = x_<i> y_<i>",
        "v_<i> = where(x_<i> > 0, x_<i>, y_<i>)",
    ]


def test_subscripts_groups_literals_primes_and_macros():
    doc = parse("index \\tau, \\tau' : N\nindex B : 3\ninput W_<(\\mu 0 a) \\tau'>\n", "s")
    ref = doc.statements[2].ref
    group, prime = ref.axes
    assert isinstance(group, syntax.Group) and prime.glyph == "τ'"
    assert [getattr(x, "glyph", getattr(x, "value", None)) for x in group.items] == ["μ", 0, "a"]
    assert group.items[0].span == Span(3, 11, 3)


def test_precedence_juxtaposition_and_powers():
    doc = parse("index μ : h\nm_<μ> = 2^(-8 (μ + 1) / h) - -1 ^ 2 ** 3", "p")
    assert equation(doc.statements[1]) == "m_<μ> = 2^(-8 (μ + 1) / h) - -1^2^3"


def test_micro_sign_and_mu_are_one_index_but_not_silently():
    # NFKC, as Python itself normalises identifiers: U+00B5 µ is U+03BC μ ...
    text = "index \u00b5 : h\ninput x_<\u00b5>\ny_<\u00b5> = x_<\u00b5>"
    spec = indexattn.compile_spec(text, name="micro")
    assert [(i.glyph, i.ascii) for i in spec.ir.indices] == [("\u03bc", "mu")]
    # ... but a spec that mixes the two spellings is told so
    mixed = "index \u00b5 : h\ninput x_<\u03bc>\ny_<\u00b5> = x_<\u00b5>"
    with pytest.raises(
        indexattn.SpecError,
        match=r"U\+03BC GREEK SMALL LETTER MU\) here and "
        r"µ \(U\+00B5 MICRO SIGN\) at line 1",
    ):
        indexattn.compile_spec(mixed, name="micro")


def test_a_negative_factor_is_reprinted_with_parentheses():
    doc = parse("index i : n\ninput a_<i>\ninput b_<i>\ny_<i> = a_<i> * -b_<i> - 2 -b_<i>", "n")
    text = equation(doc.statements[3])
    assert text == "y_<i> = a_<i> (-b_<i>) - 2 - b_<i>"
    assert equation(parse(f"index i : n\n{text}", "again").statements[1]) == text


@pytest.mark.parametrize(
    "glyph, expected",
    [
        ("τ", "tau"),
        ("τ'", "tau_p"),
        ("τ''", "tau_pp"),
        ("Ã", "A_tilde"),
        ("W_O", "W_O"),
        ("μ", "mu"),
        ("lambda", "lambda_"),
        ("x-y.z", "x_y_z"),
    ],
)
def test_ascii_names(glyph, expected):
    assert ascii_name(glyph) == expected


GREEK = {"τ": "\\tau", "μ": "\\mu"}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.booleans(), min_size=8, max_size=8),
    st.lists(st.sampled_from(["", " ", "  "]), min_size=8, max_size=8),
)
def test_greek_and_macro_spellings_compile_alike(use_macro, spaces):
    flags, pads = iter(use_macro), iter(spaces)

    def spell(ch):
        return (GREEK[ch] + " " if next(flags) else ch) if ch in GREEK else ch

    lines = MHA_GREEK.splitlines()
    out = []
    for line in lines:
        head, sep, sub = line.partition("_<")
        if sep:
            body = "".join(spell(c) for c in sub.split(">")[0])
            out.append(head + "_<" + next(pads) + body + ">" + sub.split(">", 1)[1])
        else:
            out.append(line)
    respelled = indexattn.compile_spec("\n".join(out), name="spelled")
    reference = indexattn.compile_spec(MHA_GREEK, name="spelled")
    assert respelled.source == reference.source
