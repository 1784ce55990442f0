"""Glyphs and names: Unicode normalisation, LaTeX index macros, and readable ASCII mangling."""

from __future__ import annotations

import builtins
import keyword
import re
import unicodedata

GREEK = {
    "alpha": "α",
    "beta": "β",
    "gamma": "γ",
    "delta": "δ",
    "epsilon": "ε",
    "zeta": "ζ",
    "eta": "η",
    "theta": "θ",
    "iota": "ι",
    "kappa": "κ",
    "lambda": "λ",
    "mu": "μ",
    "nu": "ν",
    "xi": "ξ",
    "omicron": "ο",
    "pi": "π",
    "rho": "ρ",
    "sigma": "σ",
    "tau": "τ",
    "upsilon": "υ",
    "phi": "φ",
    "chi": "χ",
    "psi": "ψ",
    "omega": "ω",
    "Gamma": "Γ",
    "Delta": "Δ",
    "Theta": "Θ",
    "Lambda": "Λ",
    "Xi": "Ξ",
    "Pi": "Π",
    "Sigma": "Σ",
    "Upsilon": "Υ",
    "Phi": "Φ",
    "Psi": "Ψ",
    "Omega": "Ω",
    "varepsilon": "ϵ",
    "vartheta": "ϑ",
    "varphi": "ϕ",
    "varrho": "ϱ",
    "varsigma": "ς",
    "varpi": "ϖ",
}
GLYPH_TO_MACRO = {glyph: name for name, glyph in GREEK.items()}

# Accents by their combining mark, named as LaTeX names them.
ACCENTS = {
    "\u0303": "tilde",
    "\u0302": "hat",
    "\u0304": "bar",
    "\u0307": "dot",
    "\u0308": "ddot",
    "\u0301": "acute",
    "\u0300": "grave",
    "\u0306": "breve",
    "\u030c": "check",
    "\u20d7": "vec",
}

# Names the generated module itself uses (imports, the runtime `rt`, keywords of the function,
# builtins, the unread `_`); a spec name equal to one of them gets a trailing "_".
# lower/printers/naming.py allocates every other name.
RESERVED = frozenset(
    {"torch", "F", "math", "einsum", "rearrange", "rt"}
    | {"training", "constants", "device", "dtype", "_"}
    | {"indexattn_flex"}  # backend="flex": backends/flex/run.py
) | frozenset(dir(builtins))


def normalise(text: str) -> str:
    """NFKC, as Python normalises identifiers: µ (micro sign) and μ (mu) are one letter."""
    return unicodedata.normalize("NFKC", text)


def ascii_name(glyph: str) -> str:
    """A readable ASCII identifier for a spec name: `τ'` -> `tau_p`, `Ã` -> `A_tilde`."""
    base = glyph.rstrip("'")
    primes = len(glyph) - len(base)
    words = "".join(_ascii_char(ch) for ch in unicodedata.normalize("NFD", base))
    out = re.sub(r"\x00+", "\x00", words).strip("\x00")
    out = re.sub(r"_?\x00_?", "_", out)
    out = out + ("_" + "p" * primes if primes else "")
    out = re.sub(r"[^A-Za-z0-9_]", "_", out)  # spec names (file stems) need not be identifiers
    if not out or out[0].isdigit():
        out = "_" + out
    return out + "_" if keyword.iskeyword(out) or out in RESERVED else out


def _ascii_char(ch: str) -> str:
    """One character as ASCII; NUL marks a word boundary that becomes one underscore."""
    if ch.isascii():
        return ch
    if unicodedata.combining(ch):
        return "\x00" + ACCENTS.get(ch, _unicode_word(ch)) + "\x00"
    return "\x00" + GLYPH_TO_MACRO.get(ch, _unicode_word(ch)) + "\x00"


def _unicode_word(ch: str) -> str:
    name = unicodedata.name(ch, f"u{ord(ch):04x}").lower()
    for prefix in ("combining ", "greek small letter ", "greek capital letter ", "latin "):
        name = name.removeprefix(prefix)
    return re.sub(r"[^a-z0-9]+", "_", name).strip("_") or f"u{ord(ch):04x}"


def fresh(base: str, taken: set[str]) -> str:
    """`base` if not taken, else `base_2`, `base_3`, ...; added to `taken`: the one way a
    name is allocated, for generated code (lower/printers/naming.py) and derived specs (derive/)."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name
