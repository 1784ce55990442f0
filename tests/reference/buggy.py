"""Plausible bugs that an index-notation spec rules out ("what the notation catches"): three,
the heads (r g) for (g r) both in a whole layer and in the attention core.

Each module has exactly the state_dict of a correct module in classic.py and differs from it in
one line; each agrees with the correct module only when the bug's two axes cannot be confused
(one head, one token, one group).
"""

from .classic import (
    GPT2Attention,
    GroupedQueryAttention,
    GroupedQueryCore,
    MultiHeadAttention,
    split_head_major,
)


class ReshapeHeadsMHA(MultiHeadAttention):
    """Turns (..., n, h, d_k) into (..., h, n, d_k) with reshape where transpose was meant.

    The spec writes Q_<μτa> = W_query_weight_<(μa)i> X_<τi>: the axes are named, so the
    compiler cannot mix token τ into head μ.
    """

    def split_heads(self, t):
        *batch, n, _ = t.shape
        return t.view(*batch, n, self.num_heads, self.head_dim).reshape(
            *batch, self.num_heads, n, self.head_dim
        )


class RepeatKVGQA(GroupedQueryAttention):
    """Orders query heads (r g) with Tensor.repeat where Llama's repeat_kv orders them (g r).

    The spec writes q_proj_weight_<(gra)i>: the order of g and r inside the group is explicit.
    """

    def repeat_kv(self, t):
        return t.repeat(*[1] * (t.dim() - 3), self.num_heads // self.num_kv_heads, 1, 1)


class RepeatKVCore(GroupedQueryCore):
    """gqa_core's reference with the heads of RepeatKVGQA: (r g) where repeat_kv orders (g r)."""

    def repeat_kv(self, t, n_rep):
        return t.repeat(*[1] * (t.dim() - 3), n_rep, 1, 1)


class HeadMajorGPT2(GPT2Attention):
    """Reads GPT-2's fused c_attn weight, stored (Bμa), as if it were (μBa).

    The spec writes c_attn_weight_<(Bμa)i> and slices it as c_attn_weight_<(0μa)i>.
    """

    def split_qkv(self, qkv):
        return split_head_major(qkv, self.n_head)
