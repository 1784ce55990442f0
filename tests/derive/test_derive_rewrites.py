"""Translation validation of the derived backward: reverse mode proper, then after each rewrite
of BACKWARD_REWRITES (indexattn/derive/rewrites.py), the backward's gradients equal the
literal interpreter's (float64, eval mode) on shipped specs that exercise every rewrite and on
random ones. Each rewrite has a twin: a wrong copy of it planted in its place is caught, and
the failure names it; each rewrite changes some of these specs' backward (it is exercised)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from test_derive import chains
from test_differential import specs as fuzzed
from test_robustness import valid_specs

import indexattn
from indexattn import cli
from indexattn.derive import derive, rewrites
from indexattn.derive.cotangents import Cot, negated
from indexattn.derive.rewrites import BACKWARD_REWRITES, NAMES, Rewrite
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments, sample_sizes

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

# shipped specs that, together, every rewrite changes: mha (flash, stack), forgetting (flash,
# reverse_cumsum); and reverse mode's own steps: a where's guarded branches (retention), a
# gather scattered back (t5_bias)
SPECS = ("mha", "forgetting", "retention", "t5_bias")
# a read backwards along a whole axis, scattered back by reverse mode (a flip once lowered)
FLIPPED = "index τ : N\nindex a : d\ninput x_<τa>\ny_<τa> = exp(x_<[N - 1 - τ]a>) x_<τa>\n"


def stages(spec, rewrites=BACKWARD_REWRITES):
    """("reverse", derivation) with no rewrite, then (name, derivation) after each rewrite
    whose backward text differs from the one before."""
    last = None
    for k, name in enumerate(("reverse", *(r.name for r in rewrites))):
        derived = derive(spec.ir, spec.text, spec.file, training=False, rewrites=rewrites[:k])
        if last is None or derived.text != last.text:
            yield name, derived
        last = derived


class Case:
    """A spec's random arguments, cotangents, and the literal interpreter's gradients."""

    def __init__(self, spec, sizes=None) -> None:
        self.spec = spec
        self.sizes = sizes or sample_sizes(spec.ir)
        self.args = sample_arguments(spec.ir, self.sizes, (2,))
        leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in self.args.items()}
        out = reference.evaluate(spec.ir, **leaves, **self.given(spec))
        generator = torch.Generator().manual_seed(3)
        self.cots = [torch.randn(o.shape, generator=generator, dtype=o.dtype) for o in out]
        floats = [o for o in out if o.is_floating_point()]
        loss = sum((o * c).sum() for o, c in zip(floats, self.cots))
        wanted = {k: v for k, v in leaves.items() if v.requires_grad}
        grads = torch.autograd.grad(loss, list(wanted.values()), allow_unused=True)
        self.want = {k: g for k, g in zip(wanted, grads) if g is not None}

    def given(self, compiled) -> dict:
        return {k: v for k, v in self.sizes.items() if k in compiled.size_names}

    def error(self, derived) -> float:
        """The derivation's gradients against the oracle's: max |difference| / (1 + max)."""
        name = self.spec.name
        keeping = indexattn.compile_spec(derived.forward, name=f"{name}_keeping")
        out = keeping(**self.args, **self.given(keeping))
        out = out if isinstance(out, tuple) else (out,)
        outputs = list(self.spec.ir.outputs)
        names = [t.ascii for t in (*outputs, *(t for t in derived.kept if t not in outputs))]
        found = dict(zip(names, out))
        backward = indexattn.compile_spec(derived.text, name=f"{name}_backward")
        inputs = backward.ir.tensors_of("input")[-len(derived.given) :]
        cots = {d.ascii: self.cots[outputs.index(t)] for d, t in zip(inputs, derived.given)}
        kept = {t.ascii: found[t.ascii] for t in derived.kept}
        grads = backward(**self.args, **kept, **cots, **self.given(backward))
        grads = grads if isinstance(grads, tuple) else (grads,)
        got = {
            t.ascii: g.sum_to_size(self.args[t.ascii].shape) for t, g in zip(derived.reached, grads)
        }
        assert set(got) <= set(self.want), set(got) - set(self.want)
        return max(
            (got[k] - g).abs().max().item() / (1 + g.abs().max().item())
            for k, g in self.want.items()
            if k in got
        )


def wrong_stage(spec, rewrites=BACKWARD_REWRITES, sizes=None) -> str | None:
    """Why the first stage whose backward differs from the literal interpreter does, naming
    it ("after rewrite 'flash': ..."), or None."""
    case = Case(spec, sizes)
    for name, derived in stages(spec, rewrites):
        stage = "reverse mode" if name == "reverse" else f"rewrite {name!r}"
        try:
            error = case.error(derived)
        except (RuntimeError, IndexError, indexattn.IndexAttnError) as failed:
            return f"after {stage}: the backward fails: {failed}"
        if error > 1e-10:
            return f"after {stage}: gradients off by {error:.2e}"
    return None


@pytest.mark.parametrize("name", SPECS)
def test_every_rewrite_keeps_each_shipped_specs_gradients(name):
    assert wrong_stage(indexattn.compile_spec(name)) is None


def test_a_reversal_s_backward_keeps_its_gradients():
    assert wrong_stage(indexattn.compile_spec(FLIPPED, name="flipped")) is None


@settings(deadline=None, max_examples=4, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_every_rewrite_keeps_random_chains_gradients(text):
    assert wrong_stage(indexattn.compile_spec(text, name="chain")) is None, text


@settings(deadline=None, max_examples=3, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs())
def test_every_rewrite_keeps_random_specs_gradients(text):
    assert wrong_stage(indexattn.compile_spec(text, name="random")) is None, text


@settings(deadline=None, max_examples=3, suppress_health_check=[HealthCheck.too_slow])
@given(fuzzed())
def test_every_rewrite_keeps_the_differential_fuzzers_specs_gradients(drawn):
    """Gathers, relative positions, a cache's concat and cumsum (reverse_cumsum) at random."""
    spec = indexattn.compile_spec(drawn[0], name="fuzz")
    sizes = sample_sizes(spec.ir)
    if "V" in sizes:  # positions 0 or 1 need a table of two rows
        sizes["V"] = max(sizes["V"], 2)
    assert wrong_stage(spec, sizes=sizes) is None, drawn[0]


def test_each_rewrite_changes_some_backward():
    """The validation's twin: each rewrite is seen at work on these specs."""
    seen = set()
    for name in SPECS:
        seen |= {stage for stage, _ in stages(indexattn.compile_spec(name))}
    assert seen == {"reverse", *NAMES}


def planted(run, hook: str) -> tuple[Rewrite, ...]:
    """BACKWARD_REWRITES with `run` in place of the rewrite of `hook`."""
    return tuple(Rewrite(hook, run) if r.hook == hook else r for r in BACKWARD_REWRITES)


def flash_sign_flipped(d, rows, node):
    """FlashAttention's identity with D's sign flipped."""
    found = rewrites.flash(d, rows, node)
    return found if found is rows else Cot(negated(found.node), found.free, found.all)


def stack_one_part_twice(d, parts, glyphs, tensor):
    """A stack that keeps the first part it stacked as well: counted twice."""
    found = rewrites.stack(d, parts, glyphs, tensor)
    gone = [p for p in parts if p not in found]
    return (*found, gone[0]) if gone else found


@pytest.mark.parametrize(
    "spec, run, hook",
    [
        ("mha", flash_sign_flipped, "rows"),
        ("mha", stack_one_part_twice, "sums"),
    ],
    ids=["flash", "stack"],
)
def test_a_planted_wrong_rewrite_is_caught_and_named(spec, run, hook):
    """Unplanted, mha passes (test_every_rewrite_keeps_each_shipped_specs_gradients)."""
    compiled = indexattn.compile_spec(spec)
    assert wrong_stage(compiled, planted(run, hook)).startswith(f"after rewrite {run.__name__!r}")


def test_a_reversal_off_by_one_is_caught_and_named(monkeypatch):
    """reverse_cumsum reading its flip at size - index, not size - 1 - index: named."""
    compiled = indexattn.compile_spec("linear_attention_causal")
    assert wrong_stage(compiled) is None

    def off_by_one(index, span):
        return rewrites.Field(index.size - index.symbol, (index,), span)

    monkeypatch.setattr(rewrites, "reversed_position", off_by_one)
    assert wrong_stage(compiled).startswith("after rewrite 'reverse_cumsum'")


def test_cli_grad_dumps_the_backward_after_a_rewrite(capsys):
    spec = indexattn.compile_spec("mha")
    texts = {name: derived.text for name, derived in stages(spec)}
    for name in ("reverse", "flash"):
        assert cli.main(["grad", "mha", "--dump-after", name]) == 0
        assert capsys.readouterr().out == texts[name]
    assert texts["reverse"] != texts["flash"]  # the twin: each stage is its own
    assert cli.main(["grad", "mha", "--dump-after", "flashy"]) == 2
    assert "write one of: reverse, flash, stack, reverse_cumsum" in capsys.readouterr().err
