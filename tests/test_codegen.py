"""The generated source: golden for mha.attn, readable, plain ASCII, standalone."""

import ast
import re
from pathlib import Path

import indexattn

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).resolve().parent.parent


def test_every_spec_has_a_golden_source():
    assert sorted(p.stem for p in GOLDEN.glob("*.py")) == sorted(
        p.stem for p in (ROOT / "specs").glob("*.attn")
    )


def test_source_is_golden(shipped):
    # To accept a deliberate change, reviewed: for f in specs/*.attn; do
    #   indexattn compile $f -o tests/golden/$(basename $f .attn).py --force; done
    assert shipped.source == (GOLDEN / f"{shipped.name}.py").read_text(encoding="utf-8")


def test_generated_code_is_standalone_and_one_operation_per_line(shipped):
    tree = ast.parse(shipped.source)
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"math", "torch", "einops", "rearrange", "einsum", "F"}
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    # the helpers the final program's steps and regions call for
    program = shipped.program
    steps = {type(s).__name__: s for s in program.steps}
    constants = [shipped.name + "_constants"] if program.held else []
    rows = [shipped.name + "_rows"] if program.rows is not None else []
    spans = ["key_spans"] if "Spans" in steps else []
    fused = steps.get("SoftmaxValues")  # lower/passes/softmax_values.py: one autograd step
    weights = [] if fused is None else ["softmax_values"]
    weights = ["softmax_dropout_values"] if fused and fused.dropout is not None else weights
    # the softmax policy's helper, for a softmax whose rows may be -inf everywhere
    safe = ["safe_softmax"] if any(getattr(s, "safe", False) for s in program.steps) else []
    tail = [*constants, *rows, shipped.name]
    assert sorted(functions[: -len(tail)]) == sorted([*spans, *safe, *weights])
    assert functions[-len(tail) :] == tail
    for line in shipped.source.splitlines():
        code = line.split("  #")[0]
        assert code.count("einsum(") <= 1 and code.count("rearrange(") <= 1, line


def test_identifiers_are_ascii_and_every_equation_is_quoted(shipped):
    code = "\n".join(line.split("#")[0] for line in shipped.source.splitlines())
    assert code.isascii()
    for eq in shipped.ir.equations:
        assert f"    # {eq.text}\n" in shipped.source


def needless_rearranges(source: str) -> list[str]:
    """The rearrange patterns whose two sides are the same: a copy for nothing."""
    found = []
    for pattern in re.findall(r'rearrange\([^"]*"([^"]*)"', source):
        left, right = (side.split() for side in pattern.split("->"))
        found += [pattern] if left == right else []
    return found


def test_no_needless_rearrange(shipped):
    assert needless_rearranges(shipped.source) == []


def test_a_planted_needless_rearrange_is_found():
    planted = 'Y = rearrange(X, "... tau i -> ... tau i")\nZ = rearrange(Y, "(a b) -> a b", a=2)'
    assert needless_rearranges(planted) == ["... tau i -> ... tau i"]


def test_tracebacks_show_the_generated_line():
    import traceback

    spec = indexattn.compile_spec("index i : n\ninput x_<i>\ny_<i> = log(x_<i>)", name="t")
    try:
        spec.function("not a tensor", training=False)
    except TypeError:
        text = traceback.format_exc()
    assert "y = torch.log(x)" in text


def scalar_code(text: str) -> str:
    import sympy

    from indexattn.lower.printers import ScalarPrinter

    names = {name: sympy.Symbol(name) for name in ("N", "d", "d_r")}
    return ScalarPrinter().doprint(sympy.sympify(text, locals=names))


def test_an_inverse_root_prints_as_one_root():
    assert scalar_code("1/sqrt(2*d_r)") == "1/math.sqrt(2*d_r)"
    assert eval(scalar_code("1/sqrt(2*d_r)"), {"math": __import__("math"), "d_r": 8}) == 0.25


def test_a_root_that_is_not_inverse_or_is_negative_keeps_its_factors():
    assert scalar_code("2*sqrt(d)") == "2*math.sqrt(d)"
    assert eval(scalar_code("-1/sqrt(2*d)"), {"math": __import__("math"), "d": 8}) == -0.25


def test_a_log_of_a_size_is_a_tensor_and_a_log_of_a_number_a_float():
    assert scalar_code("log(N)") == "torch.scalar_tensor(N, dtype=torch.float64).log()"
    assert scalar_code("log(2)") == "math.log(2)"


def test_whole_scalars_print_as_integers_and_others_as_floats():
    from indexattn.lower.printers import number_text

    assert [number_text(v) for v in (128.0, 0.0, 0.1, 1e-06)] == ["128", "0", "0.1", "1e-06"]


def statement_at(source: str, start: str) -> int:
    """The number of the first line of `source` that starts (after indentation) with `start`."""
    return next(n for n, line in enumerate(source.splitlines()) if line.strip().startswith(start))


def test_values_are_dropped_after_the_block_that_reads_them_last():
    source = indexattn.compile_spec(ROOT / "specs" / "rope.attn").source
    dropped = statement_at(source, "del Q_proj, Q,")
    assert dropped < statement_at(source, "Kr_prod = ")  # the queries, before the keys rotate
    assert statement_at(source, "Qr = ") < dropped
    # twin: what the kernel reads is dropped only after it
    assert statement_at(source, "del V_proj, V, Qr, Kr") > statement_at(source, "O = ")


def reversed_read(size: str):
    """Y reads X's last axis (of `size`) backwards over c : 2."""
    spec = f"index t : N\nindex c : 2\nindex e : {size}\ninput X_<te>\nY_<tc> = X_<t[1 - c]>\n"
    return indexattn.compile_spec(spec, name="t")


def test_a_position_that_reverses_an_axis_is_a_flip():
    import torch

    spec, x = reversed_read("2"), torch.randn(3, 2)
    assert "Y = X.flip(-1)" in spec.source and torch.equal(spec(X=x), x.flip(-1))
    # twin: [1 - c] on an axis of 3 reads its first two backwards: a gather, not a flip
    spec, x = reversed_read("3"), torch.randn(3, 3)
    assert "flip" not in spec.source and torch.equal(spec(X=x), x[:, [1, 0]])


def shifted_read(width: str):
    """Y reads X's last axis (of `width`) from 2 on, over p : d."""
    spec = f"index t : N\nindex p : d\nindex a : {width}\ninput X_<ta>\nY_<tp> = X_<t[2 + p]>\n"
    return indexattn.compile_spec(spec, name="t")


def test_a_position_that_shifts_into_the_axis_is_a_slice():
    import torch

    spec, x = shifted_read("d + 2"), torch.randn(3, 5)
    assert "Y = X[..., 2:]" in spec.source and torch.equal(spec(X=x, d=3), x[:, 2:])
    spec, x = shifted_read("d + 3"), torch.randn(3, 6)
    assert "Y = X[..., 2:d + 2]" in spec.source and torch.equal(spec(X=x, d=3), x[:, 2:5])
    # twin: a shift that may run past the end stays a gather, checked at the call
    spec = shifted_read("d + 1")
    assert "2:" not in spec.source and "X[..., " in spec.source


def matrix_vector(equation: str):
    spec = "index t : N\nindex h : H\nindex a : d\ninput M_<hta>\ninput v_<ha>\ninput u_<a>\n"
    return indexattn.compile_spec(spec + equation, name="mv")


def test_a_matrix_times_a_vector_is_a_matmul_and_its_gradient_keeps_the_layout():
    import torch

    m = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    v, u = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    strides = []
    for equation in ("Y_<ht> = M_<hta> v_<ha>", "Y_<ht> = v_<ha> M_<hta>"):
        spec = matrix_vector(equation)
        assert "Y = (M @ v[..., :, None]).squeeze(-1)" in spec.source, spec.source
        y = spec(M=m, v=v, u=u)
        assert torch.equal(y, (m @ v[..., None]).squeeze(-1))
        torch.testing.assert_close(y, torch.einsum("bhta,bha->bht", m, v))
    # the matrix's gradient in its own layout, where einsum's comes back with t innermost
    big = torch.randn(1, 12, 512, 64, requires_grad=True)
    vector = torch.randn(1, 12, 64)
    mine = spec(M=big, v=vector, u=torch.randn(64))
    for y in (mine, torch.einsum("bhta,bha->bht", big, vector)):
        (grad,) = torch.autograd.grad(y, big, torch.ones_like(y))
        strides.append(grad.stride()[-1])
    assert strides == [1, 512]
    # twin: a vector without the head axis would be broadcast (copied) by matmul: einsum
    spec = matrix_vector("Y_<ht> = M_<hta> u_<a>")
    assert "einsum(" in spec.source and "@" not in spec.source
    torch.testing.assert_close(spec(M=m, v=v, u=u), torch.einsum("bhta,a->bht", m, u))
