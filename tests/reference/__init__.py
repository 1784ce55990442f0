"""Hand-written reference modules that the specs in specs/ are tested against."""

from .buggy import HeadMajorGPT2, RepeatKVGQA, ReshapeHeadsMHA
from .classic import (
    ALiBiAttention,
    CausalAttention,
    ConcatHeads,
    CrossAttention,
    DkDvAttention,
    FusedHeadMajorAttention,
    GPT2Attention,
    GroupedQueryAttention,
    MultiHeadAttention,
    ScaledDotProductAttention,
    SelfAttention,
    SimpleSelfAttention,
    SlidingWindowAttention,
)

__all__ = [
    "ALiBiAttention",
    "CausalAttention",
    "ConcatHeads",
    "CrossAttention",
    "DkDvAttention",
    "FusedHeadMajorAttention",
    "GPT2Attention",
    "GroupedQueryAttention",
    "HeadMajorGPT2",
    "MultiHeadAttention",
    "RepeatKVGQA",
    "ReshapeHeadsMHA",
    "ScaledDotProductAttention",
    "SelfAttention",
    "SimpleSelfAttention",
    "SlidingWindowAttention",
]
