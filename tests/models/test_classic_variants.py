"""Each classic variant's spec, compiled, against its hand-written module in float64.

The module's state_dict is mapped onto the spec module's parameters (a rename; a stack for
ConcatHeads) and loaded strictly; outputs and the gradients of every input and parameter
must agree to 1e-10. See tests/reference/MAPPING.md.
"""

import doctest
import functools
import re
from pathlib import Path

import pytest
import sympy
import torch
from reference.buggy import HeadMajorGPT2, RepeatKVCore, RepeatKVGQA, ReshapeHeadsMHA
from reference.cases import CASES, JOURNEY, SDPA_CASES, assert_reproduces_journey

indexattn = pytest.importorskip("indexattn")

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
DOCS = ROOT / "docs" / "variants.md"
ATOL = 1e-10

BUGGY = {  # spec -> the module with the bug that spec rules out, at the spec's sizes
    "mha_separate": lambda s: ReshapeHeadsMHA(s["d_in"], s["d_out"], s["h"]),
    "gqa": lambda s: RepeatKVGQA(s["d_m"], s["h_kv"] * s["n_rep"], s["h_kv"], s["d_k"]),
    "gpt2": lambda s: HeadMajorGPT2(s["d_m"], s["h"]),
    "gqa_core": lambda s: RepeatKVCore(s["scaling"], s["p"]),
}


@functools.cache
def compiled(name):
    path = SPECS / f"{name}.attn"
    if not path.exists():
        pytest.skip(f"{path.name} is not written yet")
    return indexattn.compile_spec(path)


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def gradients(outputs, cotangents, inputs, module):
    """d(Σ output·cotangent) by input name and by parameter name."""
    params = dict(module.named_parameters())
    loss = sum((out * cot).sum() for out, cot in zip(outputs, cotangents, strict=True))
    grads = torch.autograd.grad(loss, [*inputs.values(), *params.values()])
    n = len(inputs)
    return dict(zip(inputs, grads[:n], strict=True)), dict(zip(params, grads[n:], strict=True))


def assert_all_close(got, want):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)


def setup(case, build):
    """The reference module, the spec module holding its weights, and fresh inputs."""
    torch.manual_seed(0)
    ref = build(case.sizes).double().eval()
    spec_module = compiled(case.spec).module(**case.sizes).double().eval()
    spec_module.load_state_dict(case.mapping(ref.state_dict()))
    inputs = {name: t.requires_grad_() for name, t in case.inputs(case.sizes).items()}
    return ref, spec_module, inputs


def assert_same_gradients(case, want, got, inputs, ref, spec_module, same_keys=False):
    """Input and parameter gradients of the module and the spec, for the same cotangents."""
    cotangents = [torch.randn_like(w) for w in want]
    want_inputs, want_params = gradients(want, cotangents, inputs, ref)
    got_inputs, got_params = gradients(got, cotangents, inputs, spec_module)
    assert_all_close(list(got_inputs.values()), list(want_inputs.values()))
    want_params = case.mapping(want_params)
    if same_keys:
        assert got_params.keys() == want_params.keys()
    assert_all_close([got_params[k] for k in want_params], list(want_params.values()))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.spec)
def test_spec_matches_module(case):
    ref, spec_module, inputs = setup(case, case.build)
    want = as_tuple(case.call(ref, inputs))
    got = as_tuple(spec_module(*inputs.values()))
    assert_all_close(got, want)

    assert_same_gradients(case, want, got, inputs, ref, spec_module, same_keys=True)


@pytest.mark.parametrize("spec", BUGGY)
def test_spec_tells_the_buggy_module_apart(spec):
    case = next(c for c in CASES if c.spec == spec)
    buggy, spec_module, inputs = setup(case, BUGGY[spec])
    got = as_tuple(spec_module(*inputs.values()))[0]
    assert not torch.allclose(got, as_tuple(case.call(buggy, inputs))[0], atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.spec)
def test_parameter_count(case):
    count = compiled(case.spec).param_count()
    for sizes in [case.sizes, *case.real.values()]:
        value = count.subs({s: sizes[str(s)] for s in count.free_symbols})
        assert value == sympy.sympify(case.count).subs(sizes), sizes


@pytest.mark.parametrize("case", SDPA_CASES, ids=lambda c: c.spec)
def test_spec_matches_sdpa_with_an_explicit_bias(case):
    """Variant 12 against F.scaled_dot_product_attention, the mask or ALiBi bias given as an
    explicit attn_mask: outputs and gradients, as for every other module."""
    test_spec_matches_module(case)


# The specs with dropout (and their modules: nn.Dropout, or nn.MultiheadAttention's dropout).
DROPOUT = (
    "causal_head", "mha_separate", "gpt2", "sliding_window", "alibi", "torch_mha", "gqa_core",
)  # fmt: skip


def test_every_spec_with_dropout_is_checked_in_train_mode():
    # torch's dropout: alone, in the fused kernel, or in the runtime's softmax_values
    calls = ("F.dropout(", "dropout_p=", "training=training")
    with_dropout = {c.spec for c in CASES if any(f in compiled(c.spec).source for f in calls)}
    assert with_dropout == set(DROPOUT)


@pytest.mark.parametrize("case", [c for c in CASES if c.spec in DROPOUT], ids=lambda c: c.spec)
def test_train_mode_draws_the_same_dropout_masks(case):
    """With one seed, the module's dropout and the spec's F.dropout draw the same masks: both
    call torch's dropout in the same order on tensors of the same shape and memory order. So
    in train mode, too, outputs and gradients agree; and dropout did drop something."""
    ref, spec_module, inputs = setup(case, case.build)
    ref.train()
    spec_module.train()
    torch.manual_seed(1)
    want = as_tuple(case.call(ref, inputs))
    torch.manual_seed(1)
    got = as_tuple(spec_module(*inputs.values()))
    assert_all_close(got, want)

    assert_same_gradients(case, want, got, inputs, ref, spec_module)

    evaluated = as_tuple(spec_module.eval()(*inputs.values()))
    assert not torch.allclose(got[0], evaluated[0], atol=1e-6)


def test_simple_spec_reproduces_the_published_example():
    """Variant 1's published numbers, from the spec itself: the query "journey" (row 1)."""
    context, weights = compiled("simple")(X=torch.tensor(JOURNEY, dtype=torch.float64))
    assert_reproduces_journey(context, weights)


def docs_table():
    """The rows of the table in docs/variants.md: spec, parameter formula, counts."""
    rows = []
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        link = (
            re.fullmatch(r"\[`(\w+)`\]\(\.\./specs/\1\.attn\)", cells[2])
            if len(cells) == 7
            else None
        )
        if link:
            counts = [int(n.replace(",", "")) for n in cells[6].split(" / ")]
            rows.append((link[1], cells[4].strip("`"), counts))
    return rows


def test_the_table_in_docs_variants_is_right():
    rows = docs_table()
    assert sorted(spec for spec, _, _ in rows) == sorted(c.spec for c in CASES)
    for spec, formula, counts in rows:
        case = next(c for c in CASES if c.spec == spec)
        count = compiled(spec).param_count()
        symbols = {str(s): s for s in count.free_symbols}  # with the spec's assumptions
        assert sympy.expand(count - sympy.sympify(formula, locals=symbols)) == 0, spec
        at = list(case.real.values()) or [case.sizes]
        want = [int(count.subs({s: sizes[str(s)] for s in count.free_symbols})) for sizes in at]
        assert counts == want, spec


def test_the_examples_in_docs_variants_run(monkeypatch):
    """The 24-heads ShapeError and the relayout examples are quoted from real runs."""
    monkeypatch.chdir(ROOT)
    result = doctest.testfile(str(DOCS), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
