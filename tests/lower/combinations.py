"""Specs drawn at random from the features of an attention layer (issue 48, item 6): rotary in
each phrasing, soft caps in one equation or two, ALiBi slopes, T5 buckets, windows,
documents, chunks, a prefix, sinks, grouped-query heads, fused or separate projections,
masks added or written as fills. `draw(random.Random(seed))` gives one `Combination`, whose
`text` is the spec; tests/test_combinations.py checks each against the literal interpreter
and for memory that stays below N² elements at N = 4096."""

from __future__ import annotations

import random
from dataclasses import dataclass

ROTARY = ("none", "halves", "rotate", "interleaved")  # Q0/Q1 equations, rope.attn's, GPT-J's
CAPS = ("none", "one", "two")  # c tanh(R / c) in one equation, or tanh first then c ·
MASKS = ("causal", "window", "prefix", "none")  # the order of the keys a query sees
PHRASINGS = ("added", "inline", "fill")  # M + S, where(...) inline in S, where(hide, -inf, S)


@dataclass(frozen=True)
class Combination:
    rotary: str
    cap: str
    alibi: bool
    t5: bool
    order: str  # MASKS
    documents: bool
    chunks: bool
    sinks: bool
    gqa: bool
    fused: bool
    phrasing: str

    @property
    def name(self) -> str:
        flags = [self.rotary, f"cap_{self.cap}", self.order, self.phrasing]
        flags += [
            n
            for n in ("alibi", "t5", "documents", "chunks", "sinks", "gqa", "fused")
            if getattr(self, n)
        ]
        return "_".join(flags)

    @property
    def hidden(self) -> list[str]:
        """The conditions under which a key is hidden, joined by `or`."""
        found = {
            "causal": ["τ' > τ"],
            "window": ["τ' > τ", "τ - τ' >= w"],
            "prefix": ["τ' > τ and τ' >= P"],
            "none": [],
        }[self.order]
        found += ["D_<τ> != D_<τ'>"] if self.documents else []
        found += ["floor(τ / C) != floor(τ' / C)"] if self.chunks else []
        return found

    @property
    def text(self) -> str:
        return spec_text(self)


def draw(rng: random.Random) -> Combination:
    gqa = rng.random() < 0.4
    rotary = rng.choice(ROTARY)
    return Combination(
        rotary=rotary,
        cap=rng.choice(CAPS),
        alibi=rng.random() < 0.3,
        t5=rng.random() < 0.2,
        order=rng.choice(MASKS),
        documents=rng.random() < 0.35,
        chunks=rng.random() < 0.2,
        sinks=rng.random() < 0.3,
        gqa=gqa,
        fused=not gqa and rotary == "none" and rng.random() < 0.5,
        phrasing=rng.choice(PHRASINGS),
    )


def spec_text(c: Combination) -> str:
    heads, kv = ("gr", "g") if c.gqa else ("μ", "μ")
    feature = {"none": "a", "halves": "cj", "rotate": "cj", "interleaved": "jc"}[c.rotary]
    lines = ["index τ, τ' : N", "index i : d_m"]
    lines += ["index g : h_kv", "index r : n_rep"] if c.gqa else ["index μ : h"]
    if c.rotary == "none":
        lines += ["index a : d_k"]
    else:
        lines += ["index c : 2", "index j : d_r", "index a : 2 d_r"]
    lines += ["index b : 32", "index e : 7"] if c.t5 else []
    lines += ["input X_<τi>"]
    lines += ["input D_<τ> : int"] if c.documents else []
    lines += _projections(c, heads, kv, feature)
    lines += [f"param o_proj_weight_<i({heads}a)>"]
    lines += [f"param sinks_<{_grouped(heads)}>"] if c.sinks else []
    lines += [f"param bias_<b{heads}>"] if c.t5 else []
    lines += ["scalar w = 5"] if c.order == "window" else []
    lines += ["scalar P = 6"] if c.order == "prefix" else []
    lines += ["scalar C = 8"] if c.chunks else []
    lines += ["scalar cap = 0.5"] if c.cap != "none" else []
    lines += _rotations(c, heads, kv)
    lines += _scores(c, heads, kv)
    lines += [f"O_<{heads}τa> = A_<{heads}ττ'> V_<{kv}τ'a>"]
    lines += [f"Y_<τi> = o_proj_weight_<i({heads}a)> O_<{heads}τa>", "output Y"]
    return "\n".join(lines) + "\n"


def _projections(c: Combination, heads: str, kv: str, feature: str) -> list[str]:
    if c.fused:
        return [
            "index v : 3",
            "param W_<(μva)i>",
            "Q_<μτa> = W_<(μ0a)i> X_<τi>",
            "K_<μτa> = W_<(μ1a)i> X_<τi>",
            "V_<μτa> = W_<(μ2a)i> X_<τi>",
        ]
    return [
        f"param q_proj_weight_<({heads}{feature})i>",
        f"param k_proj_weight_<({kv}{feature})i>",
        f"param v_proj_weight_<({kv}a)i>",
        f"Q_<{heads}τ{feature}> = q_proj_weight_<({heads}{feature})i> X_<τi>",
        f"K_<{kv}τ{feature}> = k_proj_weight_<({kv}{feature})i> X_<τi>",
        f"V_<{kv}τa> = v_proj_weight_<({kv}a)i> X_<τi>",
    ]


def _rotations(c: Combination, heads: str, kv: str) -> list[str]:
    """The rotated queries and keys in each phrasing, and the product that scores them."""
    if c.rotary == "none":
        return []
    lines = ["θ_<τj> = τ 10000^(-j / d_r)"]
    for name, h in (("Q", heads), ("K", kv)):
        if c.rotary == "halves":
            lines += [
                f"{name}0_<{h}τj> = {name}_<{h}τ0j> cos(θ_<τj>) - {name}_<{h}τ1j> sin(θ_<τj>)",
                f"{name}1_<{h}τj> = {name}_<{h}τ1j> cos(θ_<τj>) + {name}_<{h}τ0j> sin(θ_<τj>)",
            ]
        elif c.rotary == "rotate":
            lines += [
                f"{name}r_<{h}τcj> = {name}_<{h}τcj> cos(θ_<τj>)"
                f" + (2 c - 1) {name}_<{h}τ[1 - c]j> sin(θ_<τj>)"
            ]
        else:
            lines += [
                f"{name}r_<{h}τjc> = {name}_<{h}τjc> cos(θ_<τj>)"
                f" + (2 c - 1) {name}_<{h}τj[1 - c]> sin(θ_<τj>)"
            ]
    return lines


def _product(c: Combination, heads: str, kv: str) -> str:
    if c.rotary == "none":
        return f"Q_<{heads}τa> K_<{kv}τ'a> / sqrt(d_k)"
    if c.rotary == "halves":
        return f"(Q0_<{heads}τj> K0_<{kv}τ'j> + Q1_<{heads}τj> K1_<{kv}τ'j>) / sqrt(2 d_r)"
    feature = "cj" if c.rotary == "rotate" else "jc"
    return f"Qr_<{heads}τ{feature}> Kr_<{kv}τ'{feature}> / sqrt(2 d_r)"


def _scores(c: Combination, heads: str, kv: str) -> list[str]:
    """The scores: the product, capped, the biases, the mask; the weights, with a sink."""
    s = f"{heads}ττ'"
    lines, score = [], _product(c, heads, kv)
    if c.cap != "none":
        lines += [f"R_<{s}> = {score}"]
        if c.cap == "one":
            score = f"cap tanh(R_<{s}> / cap)"
        else:
            lines += [f"T_<{s}> = tanh(R_<{s}> / cap)"]
            score = f"cap T_<{s}>"
    if c.alibi:
        lines += [_slope(c, heads)]
        score += f" - m_<{heads}> (τ - τ')"
    if c.t5:
        lines += [
            "ρ_<ττ'> = abs(τ' - τ)",
            "β_<ττ'> = where(τ' > τ, 16, 0) + where(ρ_<ττ'> < 8, ρ_<ττ'>,"
            " 8 + sum_<e>(where(ρ_<ττ'>^2 >= 64 2^(e + 1), 1, 0)))",
        ]
        score += f" + bias_<[β_<ττ'>]{heads}>"
    hidden = " or ".join(c.hidden)
    if hidden and c.phrasing == "added":
        lines += [f"M_<ττ'> = where({hidden}, -inf, 0)"]
        score += " + M_<ττ'>"
    elif hidden and c.phrasing == "inline":
        score += f" + where({hidden}, -inf, 0)"
    elif hidden:
        score = f"where({hidden}, -inf, {score})"
    lines += [f"S_<{s}> = {score}"]
    if c.sinks:
        lines += [
            f"L_<{heads}τ> = logsumexp_<τ'>(S_<{s}>)",
            f"A_<{s}> = softmax_<τ'>(S_<{s}>) sigmoid(L_<{heads}τ> - sinks_<{_grouped(heads)}>)",
        ]
    else:
        lines += [f"A_<{s}> = softmax_<τ'>(S_<{s}>)"]
    return lines


def _slope(c: Combination, heads: str) -> str:
    if c.gqa:
        return "m_<gr> = 2^(-8 (g n_rep + r + 1) / (h_kv n_rep))"
    return "m_<μ> = 2^(-8 (μ + 1) / h)"


def _grouped(heads: str) -> str:
    return f"({heads})" if len(heads) > 1 else heads
