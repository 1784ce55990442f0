"""LaTeX: golden strings for mha.attn in the notation of SPEC_LANGUAGE.md, the two options,
names, escaping of spec text, and a PDF for every shipped spec (pdflatex)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from indexattn.cli import main
from indexattn.ir import check
from indexattn.lower.pipeline import plan
from indexattn.views import cost, latex, texdoc
from indexattn.views.report import report

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.attn"))
needs_pdflatex = pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no pdflatex")


def spec_of(name: str):
    return check((ROOT / "specs" / f"{name}.attn").read_text(encoding="utf-8"), name)


def lines(spec, **options) -> list[str]:
    return [f"{eq.lhs} = {eq.rhs}" for eq in latex.equations(spec, **options)]


def test_mha_is_golden():
    assert lines(spec_of("mha")) == [
        r"Q_{\mu\tau a} = W_{(\mu 0 a) i} \, X_{\tau i}",
        r"K_{\mu\tau a} = W_{(\mu 1 a) i} \, X_{\tau i}",
        r"V_{\mu\tau a} = W_{(\mu 2 a) i} \, X_{\tau i}",
        r"M_{\tau\tau'} = \begin{cases} -\infty & \text{if } \tau' > \tau \\ 0 & "
        r"\text{otherwise} \end{cases}",
        r"S_{\mu\tau\tau'} = \frac{Q_{\mu\tau a} \, K_{\mu\tau' a}}{\sqrt{d_k}} + M_{\tau\tau'}",
        r"A_{\mu\tau\tau'} = \operatorname{softmax}_{\tau'}\left(S_{\mu\tau\tau'}\right)",
        r"O_{\mu\tau a} = A_{\mu\tau\tau'} \, V_{\mu\tau' a}",
        r"Y_{\tau i} = (W_O)_{i(\mu a)} \, O_{\mu\tau a} + (b_O)_{i}",
    ]


def test_mha_with_contracted_indices_raised():
    assert (
        lines(spec_of("mha"), raised=True)[0]
        == r"Q_{\mu\tau a} = W_{(\mu 0 a) i} \, X_{\tau}{}^{i}"
    )
    raised = lines(spec_of("mha"), raised=True)
    assert raised[4].startswith(r"S_{\mu\tau\tau'} = \frac{Q_{\mu\tau a} \, K_{\mu\tau'}{}^{a}}")
    assert raised[6] == r"O_{\mu\tau a} = A_{\mu\tau\tau'} \, V_{\mu}{}^{\tau'}{}_{a}"
    assert raised[7] == r"Y_{\tau i} = (W_O)_{i(\mu a)} \, O^{\mu}{}_{\tau}{}^{a} + (b_O)_{i}"


def test_mha_with_explicit_sums():
    sums = lines(spec_of("mha"), sums=True)
    assert sums[0] == r"Q_{\mu\tau a} = \sum_{i} W_{(\mu 0 a) i} \, X_{\tau i}"
    assert sums[4].startswith(r"S_{\mu\tau\tau'} = \sum_{a} \frac{")
    assert sums[7] == r"Y_{\tau i} = \sum_{\mu a} (W_O)_{i(\mu a)} \, O_{\mu\tau a} + (b_O)_{i}"


def test_align_environment_is_ascii_for_every_spec():
    for path in SPECS:
        spec = check(path.read_text(encoding="utf-8"), path.stem)
        for options in ({}, {"raised": True}, {"sums": True}):
            text = latex.latex(spec, **options)
            assert text.isascii(), path.stem
            assert text.startswith("\\begin{align}\n") and text.endswith("\\end{align}\n")
            assert text.count(" &= ") == len(spec.equations)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("Ã", r"\tilde{A}"),
        ("τ'", r"\tau'"),
        ("d_k", "d_k"),
        ("W_O", "W_O"),
        ("d_in", "d_{in}"),
        ("W_μ", r"W_{\mu}"),
        ("c_attn_weight", r"\mathit{c\_attn\_weight}"),
        ("query", r"\mathit{query}"),
        ("Α", "A"),  # Greek capital alpha: LaTeX has no \Alpha
    ],
)
def test_names(name, expected):
    assert latex.math_name(name) == expected


def text_spec(equation: str, decls: str = "") -> list[str]:
    head = "index i, k : n\nindex j : m\ninput A_<ij>\ninput B_<jk>\ninput C_<k>\ninput x_<i>\n"
    return lines(check(head + decls + equation, "t"), sums=True, raised=True)


@pytest.mark.parametrize(
    "equation, expected",
    [
        (
            "Y_<i> = A_<ij> (B_<jk> C_<k>)",
            r"Y_{i} = \sum_{j k} A_{i j} \left(B^{j}{}_{k} \, C^{k}\right)",
        ),
        (
            "Y_<i> = x_<i> - A_<ij> B_<jk> C_<k>",
            r"Y_{i} = x_{i} - \sum_{j k} A_{i j} \, B^{j}{}_{k} \, C^{k}",
        ),
        (
            "Y_<i> = sum_<k>(B_<jk> C_<k>) A_<ij>",
            r"Y_{i} = \sum_{j} \sum_{k} B_{j k} \, C_{k} A_{i}{}^{j}",
        ),
        (
            "Y_<ik> = (A_<ij> B_<jk>)^2 / n",
            r"Y_{i k} = \frac{\left(\sum_{j} A_{i j} \, B^{j}{}_{k}\right)^{2}}{n}",
        ),
        (
            "Y_<ik> = exp(-A_<ij>) B_<jk>",
            r"Y_{i k} = \sum_{j} \exp\left(-A_{i j}\right) B^{j}{}_{k}",
        ),
        ("Y_<i> = 2 x_<i> 3", r"Y_{i} = 2 x_{i} \cdot 3"),
        ("Y_<ij> = where(i == j and not i > 2, A_<ij>, 0)", None),
    ],
)
def test_options_follow_einstein_summation_in_nested_products(equation, expected):
    (printed,) = text_spec(equation)
    if expected is None:
        assert r"\text{if } i = j \land \lnot i > 2" in printed
    else:
        assert printed == expected


@pytest.mark.parametrize("nested", ["else", "then"])
def test_a_chain_of_where_is_one_cases_environment(nested):
    """`where(c0, a, where(c1, b, d))` (a derived backward's stacked cotangents): one cases
    environment of three rows. The twin: a where in the taken branch stays a cases of its
    own inside the row."""
    inner = "where(i == 1, D_<ik>, C_<k>)"
    body = (
        f"where(i == 0, x_<i>, {inner})" if nested == "else" else f"where(i == 0, {inner}, x_<i>)"
    )
    (printed,) = text_spec(f"Y_<ik> = {body}", "input D_<ik>\n")
    assert printed.count(r"\begin{cases}") == (1 if nested == "else" else 2)
    if nested == "else":
        assert printed.count(r"\text{if }") == 2 and printed.count(r"\text{otherwise}") == 1


def test_a_product_with_a_negated_factor():
    (printed,) = lines(check("index i : n\ninput x_<i>\ny_<i> = x_<i> * -x_<i>", "t"))
    assert printed == r"y_{i} = x_{i} \left(-x_{i}\right)"


def test_spellings_print_the_same():
    greek = spec_of("mha")
    text = (ROOT / "specs" / "mha.attn").read_text(encoding="utf-8")
    for glyph, macro in (("τ'", "\\tau'"), ("τ", "\\tau "), ("μ", "\\mu ")):
        text = text.replace(glyph, macro)
    assert latex.latex(check(text, "mha")) == latex.latex(greek)


# -- the document


HOSTILE = (
    "# Title \\input{/etc/passwd} $x$ 100% & #1 ^^5c ~ {} _\n"
    "#\n"
    "# \\write18{touch pwned} \\end{document} \\catcode`\\^=7 <b> | ‘τ’ — √d_k Kᵀ ≠ é ß \u202e\n"
    "index i : n   # range \\immediate\\write18{touch pwned2}\n"
    "input x_<i>   # \\def\\x{1}\n"
    "Ã_<i> = 2 x_<i>   # \\input{|ls}\n"
)


def test_spec_text_is_escaped_in_the_document():
    spec = check(HOSTILE, "evil%name\n\\input")
    doc = texdoc.document(report(spec, plan(spec), cost.sizes_for(spec)))
    for command in (r"\input", r"\write18", r"\immediate", r"\def", r"\catcode", "^^5c"):
        assert command not in doc.text
    assert doc.text.isascii()
    assert r"\textbackslash{}input\{/etc/passwd\}" in doc.text


@needs_pdflatex
def test_hostile_text_compiles_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = check(HOSTILE, "evil")
    doc = texdoc.document(report(spec, plan(spec), cost.sizes_for(spec)))
    assert texdoc.pdf(doc).startswith(b"%PDF")
    assert not list(tmp_path.iterdir())


@needs_pdflatex
@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_shipped_spec_compiles_to_pdf(path):
    spec = check(path.read_text(encoding="utf-8"), path.stem)
    doc = texdoc.document(report(spec, plan(spec), cost.sizes_for(spec)), raised=True)
    data = texdoc.pdf(doc)
    assert data.startswith(b"%PDF") and b"Generated by indexattn" in data


@needs_pdflatex
def test_pdf_is_byte_for_byte_reproducible():
    spec = spec_of("gqa")
    doc = texdoc.document(report(spec, plan(spec), cost.sizes_for(spec)))
    assert texdoc.pdf(doc) == texdoc.pdf(doc)


@needs_pdflatex
def test_a_tex_error_names_the_equation():
    spec = spec_of("mha")
    doc = texdoc.document(report(spec, plan(spec), cost.sizes_for(spec)))
    broken = tuple(texdoc.Part(p.text.replace(r"\sqrt", r"\sqrtx"), p.origin) for p in doc.parts)
    with pytest.raises(texdoc.TexError) as caught:
        texdoc.pdf(texdoc.TexDocument(doc.name, broken))
    message = str(caught.value)
    assert "equation 5 (S_<μττ'> = Q_<μτa> K_<μτ'a> / sqrt(d_k) + M_<ττ'>)" in message
    assert "Undefined control sequence" in message


MISSING_LOG = r"""This is pdfTeX, Version 3.141592653-2.6-1.40.25 (TeX Live 2023/Debian)
(./spec.tex
LaTeX2e <2023-11-01> patch level 1
(/usr/share/texlive/texmf-dist/tex/latex/amsmath/amsmath.sty)

! LaTeX Error: File `{file}' not found.

Type X to quit or <RETURN> to proceed,
or enter new name. (Default extension: sty)

Enter file name:
! Emergency stop.
<read *>

l.8 \usepackage
                {{booktabs}}^^M
"""


@pytest.mark.parametrize(
    "file, package",
    [
        ("booktabs.sty", "texlive-latex-recommended"),
        ("amsmath.sty", "texlive-latex-base"),
        ("article.cls", "texlive-latex-base"),
        ("tabularx.sty", "texlive-latex-base"),
    ],
)
def test_a_missing_tex_package_names_the_debian_package(file, package):
    doc = texdoc.TexDocument("mha", (texdoc.Part("x\n" * 20, "the preamble"),))
    message = texdoc._failure(doc, MISSING_LOG.format(file=file))
    assert f"File `{file}' not found" in message
    assert f"apt-get install {package}" in message


def test_every_package_the_document_uses_has_a_debian_package():
    used = re.findall(r"\\(usepackage|documentclass)(?:\[[^]]*\])?\{\{(\w+)\}\}", texdoc.PREAMBLE)
    files = [f"{name}.{'cls' if kind == 'documentclass' else 'sty'}" for kind, name in used]
    assert len(files) == 6 and set(files) <= set(texdoc.TEX_PACKAGES)


def test_an_unknown_missing_file_says_how_to_find_its_package():
    doc = texdoc.TexDocument("mha", ())
    message = texdoc._failure(doc, MISSING_LOG.format(file="fancy.sty"))
    assert "apt-file search fancy.sty" in message


@needs_pdflatex
def test_a_real_missing_package_is_reported_with_a_hint():
    spec = spec_of("mha")
    doc = texdoc.document(report(spec, plan(spec), cost.sizes_for(spec)))
    parts = (texdoc.Part(doc.parts[0].text.replace("{booktabs}", "{nosuchpkg}"), "x"),)
    with pytest.raises(texdoc.TexError) as caught:
        texdoc.pdf(texdoc.TexDocument(doc.name, parts + doc.parts[1:]))
    assert "File `nosuchpkg.sty' not found" in str(caught.value)
    assert "apt-file search nosuchpkg.sty" in str(caught.value)


# -- the command line


def test_cli_latex_writes_a_marked_file_and_keeps_foreign_ones(tmp_path, capsys):
    out = tmp_path / "mha.tex"
    assert main(["latex", str(ROOT / "specs" / "mha.attn"), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith("% Generated by indexattn") and r"\begin{align}" in text
    foreign = tmp_path / "mine.tex"
    foreign.write_text("my own notes\n", encoding="utf-8")
    assert main(["latex", str(ROOT / "specs" / "mha.attn"), "-o", str(foreign)]) == 1
    assert foreign.read_text(encoding="utf-8") == "my own notes\n"
    assert "was not written by indexattn" in capsys.readouterr().err


@needs_pdflatex
def test_cli_pdf_writes_the_document_and_the_pdf_beside_it(tmp_path):
    out = tmp_path / "doc.tex"
    spec = str(ROOT / "specs" / "sdpa.attn")
    assert main(["latex", spec, "--pdf", "--size", "N_q=8", "-o", str(out)]) == 0
    assert (tmp_path / "doc.pdf").read_bytes().startswith(b"%PDF")
    assert r"$N_q = 8$" in out.read_text(encoding="utf-8")
    assert main(["latex", spec, "--pdf", "-o", str(out)]) == 0  # ours: overwritten
    (tmp_path / "doc.pdf").write_bytes(b"%PDF-1.5 someone else's\n")
    assert main(["latex", spec, "--pdf", "-o", str(out)]) == 1


def test_cli_latex_and_count_start_without_torch():
    code = (
        "import sys, io, contextlib\n"
        "from indexattn.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['latex', 'specs/mha.attn', '--sums']) == 0\n"
        "    assert main(['count', 'specs/gqa.attn']) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_notebook_reprs():
    import indexattn

    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    assert spec.latex() == latex.latex(spec.ir)
    assert spec._repr_latex_().startswith("$$\\begin{aligned}\n  Q_{\\mu\\tau a} &= ")
    markdown = spec._repr_markdown_()
    assert markdown.startswith("# Causal multi-head self-attention")
    assert "$$\nY_{\\tau i} = (W_O)_{i(\\mu a)}" in markdown


@needs_pdflatex
@pytest.mark.parametrize("name", ["mha", "softcap_window", "gpt2"])
def test_the_pdf_shows_the_derived_backward(name):
    """After the forward's equations, the backward's own (numbered on), compiled by TeX; a
    spec whose backward is not derived says why. The twin: the forward alone has fewer
    equations."""
    from indexattn.derive import own

    spec = spec_of(name)
    doc = texdoc.document(report(spec, plan(spec), cost.sizes_for(spec)))
    assert texdoc.pdf(doc).startswith(b"%PDF")
    section = doc.text.split("\\section*{Backward}\n", 1)[1].split("\\section*{Counts}")[0]
    backward, _, _ = own(spec)
    assert ("\\Xi" in section) == (name == "gpt2")  # dropout's mask, kept by the forward
    assert section.count("\\begin{equation}") == len(backward.equations) > 0
    assert doc.text.count("\\begin{equation}") == len(spec.equations) + len(backward.equations)
    assert "\\mathit{dY}" in section
