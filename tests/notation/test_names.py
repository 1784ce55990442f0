"""Whatever names a spec picks, the generated module keeps them apart: one allocator names
every identifier, so nothing shadows an import, a builtin, a local, a cache or a method of
nn.Module. Each reproducer of the reliability issue, then a Hypothesis name fuzzer."""

import builtins
import io
import keyword
import pickle
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import indexattn
from indexattn.oracle.verify import compare, sample_arguments, sample_sizes


def check(text: str, name: str = "t") -> indexattn.CompiledSpec:
    spec = indexattn.compile_spec(text, name=name)
    result = compare(spec)
    assert result.ok, (result.error, spec.source)
    return spec


def chain(n: int) -> str:
    head = "index a, b : n\n" + "".join(f"input T{k}_<ab>\n" for k in range(n))
    return head + "Y_<a> = " + " ".join(f"T{k}_<ab>" for k in range(n)) + "\n"


@pytest.mark.parametrize("n", [10, 30, 100])
def test_long_products_plan_in_well_under_a_second(n):
    start = time.perf_counter()
    indexattn.compile_spec(chain(n), name=f"chain{n}")
    assert time.perf_counter() - start < 1.0


def test_a_long_product_still_equals_the_literal_reading():
    check(chain(10), "chain10")


def test_indices_whose_python_names_end_in_an_underscore():
    # λ is lambda_ and F is F_ in Python; einops rejects axis names ending in "_"
    spec = check(
        "index λ : n\nindex F, G : m\nindex B : 2\ninput X_<λF>\nparam W_<(GB)F>\n"
        "Y_<λG> = W_<(G0)F> X_<λF>\nZ_<λG> = W_<(G1)F> X_<λF> + Y_<λG>\n",
        "lam",
    )
    assert "lambda_" in spec.source and "einsum(" in spec.source  # slices read through einops


def test_caches_of_two_masks_never_meet():
    # was: a spec named _M with masks M and M_cache shared one module-level cache
    text = """index τ, τ' : N
input X_<τ'>
M_<ττ'> = where(τ' > τ, -inf, 0)
M_cache_<ττ'> = where(τ' < τ, 1, 2)
S_<ττ'> = X_<τ'> + M_<ττ'> + M_cache_<ττ'>
Y_<τ> = softmax_<τ'>(S_<ττ'>) X_<τ'>
"""
    check(text, "_M")
    check(
        text.replace("input X_<τ'>", "input X_<τ'>\ninput _M_<τ'>").replace(
            "X_<τ'> + M", "X_<τ'> + _M_<τ'> + M"
        ),
        "_M",
    )


def projections(word: str, combine: str) -> str:
    """A spec whose fused projection yields one tensor per letter of `word`."""
    letters = "".join(dict.fromkeys(word))
    body = "".join(f"{c}_<τν> = W_<({k}ν)ω> X_<τω>\n" for k, c in enumerate(letters))
    head = f"index τ : N\nindex ω, ν : d\nindex B : {len(letters)}\ninput X_<τω>\n"
    total = combine.join(f"{c}_<τν>" for c in letters)
    return head + "param W_<(Bν)ω>\n" + body + f"Y_<τν> = {total}\n"


@pytest.mark.parametrize("word", ["math", "torch", "einsum"])
def test_a_local_never_takes_an_import_name(word):
    # fused projections from weights named m, a, t, h made a local named `math`
    spec = check(projections(word, " + "), word)
    assert f"{word} = " not in spec.source


@pytest.mark.parametrize("name", ["__debug", "_", "__debug__", "constants", "device"])
def test_tensors_named_like_python_internals(name):
    check(f"index i : n\ninput {name}_<i>\nY_<i> = 2 {name}_<i> + 1\n", "t")


HOSTILE = """index τ : N
index i, i' : d
input self_<τi>
param to_<ii'>
param forward_<i>
param spec_<i>
param _parameters_<i>
buffer sizes_<i>
scalar train = 2.0
scalar cuda = 0.5
scalar zero_grad = 1.0
Y_<τi> = to_<ii'> self_<τi'> train + cuda forward_<i> + zero_grad spec_<i> +
    _parameters_<i> + sizes_<i>
"""


def test_spec_names_that_are_module_attributes_stay_state_dict_keys():
    spec = check(HOSTILE, "hostile")
    module = spec.module(d=4).double()
    assert sorted(module.state_dict()) == ["_parameters", "forward", "sizes", "spec", "to"]
    assert module.scalars == {"train": 2.0, "cuda": 0.5, "zero_grad": 1.0}
    assert callable(module.cuda) and callable(module.zero_grad) and callable(module.to)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    want = spec(self=x, **module.state_dict())
    assert torch.equal(module(x), want)
    module.scalars["train"] = 3.0  # the twin: the scalar reaches the call
    assert not torch.equal(module(x), want)


def test_modules_pickle_and_torch_save_round_trip():
    spec = indexattn.compile_spec(HOSTILE, name="hostile")
    module = spec.module(d=4).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert torch.equal(loaded(x), module(x))
    again = pickle.loads(pickle.dumps(module))
    assert torch.equal(again(x), module(x))
    with torch.no_grad():
        again._parameters["to"].add_(1.0)  # the copy is a copy
    assert not torch.equal(again(x), module(x))


def test_compiled_specs_pickle_as_their_text():
    spec = indexattn.compile_spec("index i : n\ninput x_<i>\ny_<i> = 2 x_<i>\n", name="double")
    again = pickle.loads(pickle.dumps(spec))
    assert again.source == spec.source
    assert torch.equal(again(x=torch.ones(2)), torch.full((2,), 2.0))


# -- the name fuzzer

KEYWORDS = [k for k in keyword.kwlist + keyword.softkwlist if k.isidentifier()]
BUILTINS = ["sum", "max", "input", "id", "type", "len", "print", "object", "__debug__", "exec"]
IMPORTS = ["torch", "F", "math", "einsum", "rearrange", "nn"]
LOCALS = [
    "Q_proj",
    "S_prod",
    "S_bias_sum",
    "Q_scaled",
    "W_split",
    "M_keep",
    "M_grid",
    "Y_out",
    "Y_2",
    "QKV",
    "constants",
    "device",
    "dtype",
    "training",
    "t_constants",
    "mu",
    "tau_p",
]
ATTRIBUTES = [
    "to",
    "forward",
    "half",
    "spec",
    "sizes",
    "_parameters",
    "train",
    "cuda",
    "zero_grad",
    "scalars",
    "self",
    "_buffers",
    "state_dict",
    "training_",
]
NAMES = KEYWORDS + BUILTINS + IMPORTS + LOCALS + ATTRIBUTES
LETTERS = [*"aFxλμτσжЖדあ中ŋßø", "λ'", "a'", "F'"]
TEMPLATE = """index {I}, {I2} : {N}
index {J}, {J2} : {D}
index {K} : 2
scalar {s} = 0.5
input {X}_<{I}{J}>
param {W}_<({K}{J2}){J}>
{A}_<{I}{J2}> = {W}_<(0{J2}){J}> {X}_<{I}{J}>
{B}_<{I}{J2}> = {W}_<(1{J2}){J}> {X}_<{I}{J}>
{M}_<{I}{I2}> = where({I2} > {I}, -inf, 0)
{S}_<{I}{I2}> = {A}_<{I}{J2}> {B}_<{I2}{J2}> {s} + {M}_<{I}{I2}>
{Y}_<{I}{J2}> = softmax_<{I2}>({S}_<{I}{I2}>) {A}_<{I2}{J2}>
"""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    words=st.lists(st.sampled_from(NAMES), min_size=11, max_size=11, unique=True),
    letters=st.lists(st.sampled_from(LETTERS), min_size=5, max_size=5, unique=True),
)
def test_names_from_everywhere_compile_and_agree_or_are_spec_errors(words, letters):
    keys = ["X", "W", "A", "B", "M", "S", "Y", "s", "N", "D", "name"]
    names = dict(zip(keys, words)) | dict(zip(["I", "I2", "J", "J2", "K"], letters))
    try:
        spec = indexattn.compile_spec(TEMPLATE.format(**names), name=names["name"])
    except indexattn.SpecError:
        return
    result = compare(spec)
    assert result.ok, (result.error, spec.source)
    sizes = sample_sizes(spec.ir)
    module = spec.module(**sizes).double()
    args = sample_arguments(spec.ir, sizes)
    module.load_state_dict({k: args[k] for k in module.state_dict()})
    x = args[spec.ir.tensors_of("input")[0].ascii]
    assert torch.allclose(
        module(x), spec(**args, **{k: v for k, v in sizes.items() if k in spec.required})
    )


def test_the_fuzzer_pools_hold_what_the_generated_module_uses():
    # a twin for the fuzzer: its pools really are the names that used to collide
    assert {"torch", "F", "math", "constants"} <= set(NAMES)
    assert "__debug__" in dir(builtins) and "__debug__" in NAMES
