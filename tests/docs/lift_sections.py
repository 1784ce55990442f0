"""docs/lift.md's "Lifted modules" sections: each module lifted now and its spec printed beside
it, the hand-written modules (tests/lift_modules.py) with their code, the transformers families
(tests/lift_families.py) with their config and the call. `python tests/docs/lift_sections.py`
rewrites the sections; tests/docs/test_lift_page.py checks that the page holds what lift
prints now."""

import inspect
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PAGE = TESTS.parent / "docs" / "lift.md"
START, END = "<!-- lifted modules: begin -->\n", "<!-- lifted modules: end -->\n"
HAND = {  # title -> (class in tests/lift_modules.py, its keywords, the example's width)
    "nanoGPT's CausalSelfAttention": ("CausalSelfAttention", {}, 16),
    "nanoGPT's CausalSelfAttention, flash (SDPA, is_causal)": (
        "CausalSelfAttention",
        {"flash": True},
        16,
    ),
    "torch.nn.MultiheadAttention (batch first, self-attention)": ("SelfMHA", {}, 12),
    "Per-head nn.Linear heads, concatenated and projected": ("MultiHead", {}, 12),
    "Grouped-query attention with rotate-half rotary, causal": ("RotaryGQA", {}, 16),
}


def lifted_text(module, x, **keywords) -> str:
    import torch

    import indexattn

    torch.manual_seed(0)
    return indexattn.lift(module, x, **keywords).spec_text


def hand_sections() -> list[str]:
    import lift_modules
    import torch

    out = []
    for title, (name, keywords, width) in HAND.items():
        cls = getattr(lift_modules, name)
        text = lifted_text(cls(**keywords).eval(), torch.randn(2, 6, width))
        made = ", ".join(f"{k}={v!r}" for k, v in keywords.items())
        out.append(
            f"### {title}\n\n`{name}({made})` of tests/lift_modules.py, lifted as "
            f"`indexattn.lift(layer, x)`:\n\n```python\n{inspect.getsource(cls)}```\n\n"
            f"```\n{text}```\n"
        )
    return out


def family_sections() -> list[str]:
    import lift_families
    import torch

    out = []
    for name, (_module, stem, fields) in lift_families.FAMILIES.items():
        layer, keywords = lift_families.family(name)
        text = lifted_text(layer, torch.randn(2, 6, lift_families.WIDTH), **keywords)
        config = {**lift_families.BASE, **fields}
        shown = ", ".join(f"{k}={v!r}" for k, v in config.items() if v is not None)
        eager = name in lift_families.EAGER
        mask = (
            "sliding_window_causal_mask_function(3)"
            if "sliding_window" in fields
            else ("causal_mask_function")
        )
        rotary = "position_embeddings=rotary, " if "position_embeddings" in keywords else ""
        out.append(
            f"### transformers: {name}\n\n`{stem}Attention({stem}Config({shown}, "
            f'attn_implementation="{"eager" if eager else "sdpa"}"), 0)`, rotary '
            f"`{stem}RotaryEmbedding(config)`, lifted as `indexattn.lift(layer, x, {rotary}"
            f"attention_mask={mask})`:\n\n```\n{text}```\n"
        )
    return out


def sections() -> str:
    sys.path.insert(0, str(TESTS))
    return START + "\n".join(hand_sections() + family_sections()) + END


def on_page(text: str) -> str:
    return text[text.index(START) : text.index(END) + len(END)]


if __name__ == "__main__":
    page = PAGE.read_text()
    PAGE.write_text(page.replace(on_page(page), sections()))
