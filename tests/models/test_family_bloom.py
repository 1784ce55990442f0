"""specs/models/bloom.attn against transformers' BloomAttention (models_common.LayerTests).

Tiny configs built here with random weights (nothing is downloaded), float64, eval. Bloom's
softmax is float32 in transformers (softmax(..., dtype=torch.float32)): the 1e-10 tests take
the upcast out, the layer as it is agrees within OWN_ATOL. Its ALiBi tensor is made by
transformers' build_alibi_tensor: its slopes are computed in float32, exact for the head counts
compared here (4 and 6: every slope a power of two); the spec computes them itself in float64.
"""

from typing import ClassVar

import pytest
import torch
from models_common import B, Case, LayerTests, OwnPrecisionTests, causal_mask, hidden, randomise
from models_common import spec as compiled

pytest.importorskip("transformers")
pytest.importorskip("indexattn.transformers")

from transformers import BloomConfig
from transformers.models.bloom import modeling_bloom as bloom

pytestmark = pytest.mark.slow  # tests/conftest.py: the quick tier leaves it out

N = 8
HEADS = {"bloom_4_heads": 4, "bloom_6_heads": 6}


def config_of(heads: int) -> BloomConfig:
    return BloomConfig(hidden_size=24, n_head=heads, vocab_size=40, num_hidden_layers=2)


class TestBloom(OwnPrecisionTests, LayerTests):
    CASES = OWN = tuple(HEADS)
    REAL: ClassVar = {  # Bloom-176B
        "bloom": (
            "bloom", bloom.BloomAttention, BloomConfig(hidden_size=14336, n_head=112),
            {"layer_idx": 0},
        ),
    }  # fmt: skip

    def case(self, name, exact=True):
        """A key hidden in the middle of batch 1, so that its keys' ALiBi positions (counted
        over unpadded tokens) are not their indices; exact: the float64_softmax fixture."""
        config = config_of(HEADS[name])
        layer = randomise(bloom.BloomAttention(config, layer_idx=0)).double().eval()
        x, residual = hidden(N, 24), hidden(N, 24, seed=6)
        padding = torch.ones(B, N, dtype=torch.long)
        padding[1, 2] = 0
        mask = causal_mask(N, {1: 2})[:, 0]
        alibi = bloom.build_alibi_tensor(padding, HEADS[name], torch.float64)
        positions = (padding.cumsum(-1) - 1) * padding
        return Case(
            layer, compiled("bloom"), (x, residual), mask,
            ours=lambda module, m: module(x, residual, positions, m),
            theirs=lambda: layer(x, residual, alibi, mask[:, None]),
            given={"config": config},  # BloomAttention keeps none
        )  # fmt: skip

    def test_keys_at_their_indices_are_caught(self, float64_softmax):
        """The twin of Bloom's positions: with a key padded in the middle, the key positions
        counted over unpadded tokens are not the indices 0..N-1, and the spec sees the
        difference."""
        case = self.case("bloom_6_heads")
        y = case.module()(*case.leaves, torch.arange(N), case.mask)[0]
        with pytest.raises(AssertionError):
            torch.testing.assert_close(y, case.theirs()[0], atol=1e-10, rtol=0)

    @pytest.mark.parametrize("heads", [6, 12, 16, 112])  # 112: Bloom-176B
    def test_alibi_slopes_are_build_alibi_tensors(self, heads):
        """The spec's slopes, computed in float64, against transformers' (computed in float32)."""
        slopes = compiled("bloom").constants_function(heads, device="cpu", dtype=torch.float64)[0]
        theirs = bloom._get_alibi_slopes(heads, "cpu").double()
        torch.testing.assert_close(slopes, theirs, atol=0, rtol=1e-6)

    def test_the_papers_slopes_are_not_blooms_for_112_heads(self):
        """The twin: ALiBi's 2^(-8 (μ + 1) / h) (specs/alibi.attn) differs from Bloom's at a
        head count that is not a power of two."""
        paper = 2.0 ** (-8 * (torch.arange(112, dtype=torch.float64) + 1) / 112)
        with pytest.raises(AssertionError):
            torch.testing.assert_close(paper, bloom._get_alibi_slopes(112, "cpu").double())
