"""Every ```attn example of docs/language.md compiles and equals the literal reading of its
equations, so the reference cannot drift from the compiler."""

import re
from pathlib import Path

import pytest

import indexattn
from indexattn.oracle.verify import compare

# Generated code runs without a warning (torch.tensor of a tensor warns, for one).
pytestmark = pytest.mark.filterwarnings("error")
PAGE = Path(__file__).resolve().parents[2] / "docs" / "language.md"
EXAMPLES = re.findall(r"```attn\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def test_the_page_has_examples():
    assert len(EXAMPLES) >= 6


@pytest.mark.parametrize("k", range(len(EXAMPLES)))
def test_each_example_compiles_and_equals_the_literal_reading(k):
    spec = indexattn.compile_spec(EXAMPLES[k], name=f"example{k}")
    for batch in ((), (2,)):
        result = compare(spec, batch=batch)
        assert result.ok, (result.error, spec.source)
