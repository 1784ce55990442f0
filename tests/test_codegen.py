"""The generated source: golden for mha.attn, readable, plain ASCII, standalone."""

import ast
import re
from pathlib import Path

import indexattn

GOLDEN = Path(__file__).parent / "golden" / "mha.py"
ROOT = Path(__file__).resolve().parent.parent


def test_mha_source_is_golden():
    # To accept a deliberate change: indexattn compile specs/mha.attn -o tests/golden/mha.py
    spec = indexattn.compile_spec(ROOT / "specs" / "mha.attn")
    assert spec.source == GOLDEN.read_text(encoding="utf-8")


def test_generated_code_is_standalone_and_one_operation_per_line(shipped):
    tree = ast.parse(shipped.source)
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"math", "torch", "einops", "rearrange", "einsum", "F"}
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [f.name for f in functions] == [shipped.name]
    for line in shipped.source.splitlines():
        code = line.split("  #")[0]
        assert code.count("einsum(") <= 1 and code.count("rearrange(") <= 1, line


def test_identifiers_are_ascii_and_every_equation_is_quoted(shipped):
    code = "\n".join(line.split("#")[0] for line in shipped.source.splitlines())
    assert code.isascii()
    for eq in shipped.ir.equations:
        assert f"    # {eq.text}\n" in shipped.source


def test_no_needless_rearrange():
    source = indexattn.compile_spec(ROOT / "specs" / "mha.attn").source
    for pattern in re.findall(r'rearrange\([^"]*"([^"]*)"', source):
        left, right = (side.split() for side in pattern.split("->"))
        assert left != right, f"a no-op rearrange: {pattern}"


def test_tracebacks_show_the_generated_line():
    import traceback

    spec = indexattn.compile_spec("index i : n\ninput x_<i>\ny_<i> = log(x_<i>)", name="t")
    try:
        spec.function("not a tensor", training=False)
    except TypeError:
        text = traceback.format_exc()
    assert "y = torch.log(x)" in text
