"""Translation validation of the derived backward: reverse mode proper, then after each rewrite
of BACKWARD_REWRITES (indexattn/derive/rewrites.py), the backward's gradients equal the
literal interpreter's (float64, eval mode) on every shipped spec and random ones. A wrong
rewrite planted in the list is caught and named; each rewrite changes some shipped spec's
backward (it is exercised)."""

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from test_derive import chains
from test_robustness import valid_specs

import indexattn
from indexattn.derive import derive
from indexattn.derive.reverse import Cot, Derivation, Rewrite
from indexattn.derive.rewrites import BACKWARD_REWRITES, NAMES
from indexattn.oracle import reference
from indexattn.oracle.verify import sample_arguments, sample_sizes

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.attn"))


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

    def __init__(self, spec) -> None:
        self.spec = spec
        self.sizes = sample_sizes(spec.ir)
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


def zero_padded(spec) -> bool:
    """Whether a `where` keeps a read inside its axis (a convolution's zero padding): only the
    guard rewrite differentiates that read where the forward reads it."""
    from indexattn import ir
    from indexattn.lower.numerics import guarded

    wheres = (n for eq in spec.ir.equations for n in ir.walk(eq.rhs))
    return any(list(ir.refs(guarded(n))) != list(ir.refs(n)) for n in wheres)


def first_wrong(spec, rewrites=BACKWARD_REWRITES) -> str | None:
    """The first stage whose backward differs from the literal interpreter, or None."""
    case = Case(spec)
    for name, derived in stages(spec, rewrites):
        if name == "reverse" and zero_padded(spec):
            continue  # reverse mode proper reads past the axis where no where guards it
        if case.error(derived) > 1e-10:
            return name
    return None


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_rewrite_keeps_each_shipped_specs_gradients(path):
    assert first_wrong(indexattn.compile_spec(path)) is None


@settings(deadline=None, max_examples=5, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_every_rewrite_keeps_random_chains_gradients(text):
    assert first_wrong(indexattn.compile_spec(text, name="chain")) is None, text


@settings(deadline=None, max_examples=4, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs())
def test_every_rewrite_keeps_random_specs_gradients(text):
    assert first_wrong(indexattn.compile_spec(text, name="random")) is None, text


def test_each_rewrite_changes_some_shipped_backward():
    """The twin of the validation: each rewrite is seen at work on some shipped spec."""
    seen = set()
    for path in SPECS:
        seen |= {name for name, _ in stages(indexattn.compile_spec(path))}
    assert seen == {"reverse", *NAMES}


def test_a_planted_wrong_rewrite_is_caught_and_named(monkeypatch):
    """A rewrite of softmax's row sum that writes 0 (wrong unless the row's cotangent is
    orthogonal to A), planted after the others: caught on mha, and named."""

    def wrong(self, node):
        return Cot("0", frozenset())

    monkeypatch.setattr(Derivation, "zero_rows", wrong, raising=False)
    planted = (*BACKWARD_REWRITES, Rewrite("planted", "rows", "zero_rows", "none"))
    spec = indexattn.compile_spec("mha")
    assert first_wrong(spec) is None
    assert first_wrong(spec, planted) == "planted"
