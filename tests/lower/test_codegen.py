"""The generated source: golden for mha.attn, readable, plain ASCII, standalone."""

import ast
import builtins
import re
from pathlib import Path

import pytest

import indexattn

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
ROOT = Path(__file__).resolve().parents[2]


def test_every_spec_has_a_golden_source():
    assert sorted(p.stem for p in GOLDEN.glob("*.py")) == sorted(
        p.stem for p in (ROOT / "specs").glob("*.attn")
    )


def test_source_is_golden(shipped):
    # To accept a deliberate change, reviewed: for f in specs/*.attn; do
    #   indexattn compile $f -o tests/golden/$(basename $f .attn).py --force; done
    assert shipped.source == (GOLDEN / f"{shipped.name}.py").read_text(encoding="utf-8")


def unused_definitions(source: str) -> set[str]:
    """The module-level functions and classes of `source` that nothing in it reads."""
    tree = ast.parse(source)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return defined - read


def imported(source: str) -> set[str]:
    """The modules `source` imports, and the names it imports from them."""
    tree = ast.parse(source)
    return {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}


PLAIN = {"math", "torch", "einops", "rearrange", "einsum", "F"}


def test_generated_code_imports_the_runtime_and_defines_only_what_it_uses(shipped):
    """The module imports torch, einops and the runtime (runtime/lib.py); its standalone
    form, nothing of indexattn; each defines only what it uses."""
    assert imported(shipped.source) <= PLAIN | {"indexattn.runtime", "lib"}
    assert unused_definitions(shipped.source) == {shipped.name}  # the spec's own function
    alone = shipped.standalone_source
    assert imported(alone) <= PLAIN | {"types", "SimpleNamespace"}
    assert unused_definitions(alone) == {shipped.name}
    assert ("indexattn.runtime" in imported(shipped.source)) == (alone != shipped.source)


def test_a_planted_unused_helper_is_found():
    planted = "def helper():\n    return 1\n\n\ndef f(x):\n    return x\n"
    assert unused_definitions(planted) == {"helper", "f"}
    assert unused_definitions(planted.replace("return x", "return helper()")) == {"f"}


# One operation per line (docs/rendering.md): every call in a statement counts, except the
# calls that compute nothing on tensor data: views of a result (layout), casts of it,
# metadata, list bookkeeping, and arithmetic on sizes, scalars and numbers alone (a call
# that reads no tensor). The runtime's functions (key_spans, softmax_values: runtime/lib.py)
# are code of their own, not printed from steps, and are not read.
VIEWS = {"transpose", "flatten", "unflatten", "movedim", "permute", "view", "unsqueeze"}
VIEWS |= {"squeeze", "expand", "expand_as", "narrow", "select", "unbind", "split", "mT"}
VIEWS |= {"contiguous"}  # a layout: a copy only where the strides ask for one
CASTS = {"to", "long", "int", "float", "bool"}
BOOKKEEPING = {"dim", "size", "numel", "append", "range", "len"}
NUMBERS = {"math", "torch", "F", "device", "dtype", "table", "training", *dir(builtins)}


def operations(node: ast.stmt, numbers: set[str]) -> list[str]:
    """The calls of one statement that operate on tensor data."""
    counted = []
    for call in (c for c in ast.walk(node) if isinstance(c, ast.Call)):
        name = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id
        read = {n.id for n in ast.walk(call) if isinstance(n, ast.Name)}
        if name in VIEWS | CASTS | BOOKKEEPING or read <= numbers:
            continue
        counted.append(name)
    return counted


def crowded_lines(source: str, numbers: set[str], functions: set[str]) -> list[str]:
    """The statements of `functions` in `source` with more than one operation."""
    tree, lines = ast.parse(source), source.splitlines()
    knobs = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets}
    numbers = numbers | knobs | NUMBERS  # module-level numbers: BLOCK_SCORES = 2 ** 22
    found = []
    for function in (n for n in tree.body if getattr(n, "name", None) in functions):
        for node in ast.walk(function):
            simple = isinstance(node, ast.stmt) and not hasattr(node, "body")
            if simple and len(operations(node, numbers)) > 1:
                found.append(lines[node.lineno - 1].strip())
    return found


EVERY_SPEC = sorted((ROOT / "specs").rglob("*.attn"))


@pytest.mark.parametrize("path", EVERY_SPEC, ids=[p.stem for p in EVERY_SPEC])
def test_one_operation_per_line(path):
    spec = indexattn.compile_spec(path)
    numbers = {*spec.ir.size_asciis, *(s.ascii for s in spec.ir.scalars)}
    functions = {spec.ir.name + suffix for suffix in ("", "_constants", "_rows")}
    assert crowded_lines(spec.source, numbers, functions) == []


def test_a_line_of_two_operations_is_found_and_views_casts_and_sizes_are_not():
    source = (
        "def f(x, n):\n"
        "    y = torch.exp(x).transpose(-2, -1).to(dtype)\n"
        "    z = torch.softmax(y, dim=-1) * math.sqrt(n)\n"
        "    w = torch.as_tensor(max(1, math.log(n)), device=device)\n"
        "    return torch.tanh(torch.exp(z)) + w\n"
    )
    assert crowded_lines(source, {"n"}, {"f"}) == ["return torch.tanh(torch.exp(z)) + w"]
    # a tensor named by a capital letter is a tensor, not a module-level number
    assert crowded_lines(source.replace("(x", "(X"), {"n"}, {"f"}) == [
        "return torch.tanh(torch.exp(z)) + w"
    ]
    two = "K = 2\n\n\ndef f(M):\n    return key_spans(M != -math.inf, K * M.isneginf())\n"
    assert crowded_lines(two, set(), {"f"}) == [
        "return key_spans(M != -math.inf, K * M.isneginf())"
    ]
    assert crowded_lines(source, {"n"}, {"g"}) == []  # only the functions named are read


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

    from indexattn.lower.printers.expressions import ScalarPrinter

    # sizes are whole and positive (lower/printers/values.py), scalars real
    names = {name: sympy.Symbol(name, integer=True, positive=True) for name in ("N", "d", "d_r")}
    names["C"] = sympy.Symbol("C", real=True)
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


def test_a_floor_or_ceiling_of_whole_sizes_prints_as_integer_division():
    assert scalar_code("floor(d_r/2)") == "d_r // 2"
    assert scalar_code("ceiling(N/d)") == "(N + d - 1) // d"
    assert scalar_code("N - floor(d_r/2)") == "N - (d_r // 2)"
    big = {"math": __import__("math"), "N": 2**60 + 3, "d": 4, "d_r": 2**60 + 1}
    assert eval(scalar_code("ceiling(N/d)"), big) == 2**58 + 1  # exact past 2^53
    assert eval(scalar_code("floor(d_r/2)"), big) == 2**59
    # twin: over a real scalar, the float quotient's floor, as the spec says, by torch's (a
    # scalar may be a tensor: issue 51)
    scope = {"torch": __import__("torch"), "N": 7, "C": 2.0}
    assert scalar_code("floor(N/C)") == "torch.floor(N/torch.as_tensor(C, dtype=torch.float64))"
    assert eval(scalar_code("floor(N/C)"), scope) == 3


def test_whole_scalars_print_as_integers_and_others_as_floats():
    from indexattn.lower.printers.expressions import number_text

    assert [number_text(v) for v in (128.0, 0.0, 0.1, 1e-06)] == ["128", "0", "0.1", "1e-06"]


def dropped_after(program, tensor: str) -> set[str]:
    """The values the spec's function drops after the block of `tensor`'s equation, by the
    planner's hints."""
    (block,) = [b for b in program.blocks if tensor in {eq.tensor.ascii for eq in b.equations}]
    return {v.hint for v in block.drop}


def test_values_are_dropped_after_the_block_that_reads_them_last():
    program = indexattn.compile_spec(ROOT / "specs" / "rope.attn").program
    # the queries, once rotated, before the keys rotate; the keys after theirs
    assert {"Q", "Q_proj"} <= dropped_after(program, "Qr")
    assert {"K", "K_proj"} <= dropped_after(program, "Kr")
    # twin: what the kernel reads is dropped only after it, not after the rotation
    assert "V" not in dropped_after(program, "Kr")
    assert {"V", "Qr", "Kr"} <= dropped_after(program, "O")


def kinds(spec) -> set[str]:
    """The kinds of the steps of a spec's final program."""
    return {type(s).__name__ for s in spec.program.steps}


def reversed_read(size: str):
    """Y reads X's last axis (of `size`) backwards over c : 2."""
    spec = f"index t : N\nindex c : 2\nindex e : {size}\ninput X_<te>\nY_<tc> = X_<t[1 - c]>\n"
    return indexattn.compile_spec(spec, name="t")


def test_a_position_that_reverses_an_axis_is_a_flip():
    import torch

    spec, x = reversed_read("2"), torch.randn(3, 2)
    assert "Flip" in kinds(spec) and "Gather" not in kinds(spec)
    assert torch.equal(spec(X=x), x.flip(-1))
    # twin: [1 - c] on an axis of 3 reads its first two backwards: a gather, not a flip
    spec, x = reversed_read("3"), torch.randn(3, 3)
    assert "Flip" not in kinds(spec) and "Gather" in kinds(spec)
    assert torch.equal(spec(X=x), x[:, [1, 0]])


def shifted_read(width: str):
    """Y reads X's last axis (of `width`) from 2 on, over p : d."""
    spec = f"index t : N\nindex p : d\nindex a : {width}\ninput X_<ta>\nY_<tp> = X_<t[2 + p]>\n"
    return indexattn.compile_spec(spec, name="t")


def test_a_position_that_shifts_into_the_axis_is_a_slice():
    import torch

    spec, x = shifted_read("d + 2"), torch.randn(3, 5)
    assert kinds(spec) == {"Slice"} and torch.equal(spec(X=x, d=3), x[:, 2:])
    spec, x = shifted_read("d + 3"), torch.randn(3, 6)
    assert kinds(spec) == {"Slice"} and torch.equal(spec(X=x, d=3), x[:, 2:5])
    # twin: a shift that may run past the end stays a gather, checked at the call
    spec = shifted_read("d + 1")
    assert "Slice" not in kinds(spec) and "Gather" in kinds(spec)


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
