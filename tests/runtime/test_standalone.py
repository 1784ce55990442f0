"""`--standalone`: every golden's standalone form (the runtime it imports inlined,
runtime/standalone.py) runs in a process where indexattn cannot be imported, and equals the
imported form bit for bit, outputs and gradients, with the knobs at sizes that reach blocks
of rows, spans and chunks; the twin: the imported form fails there."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from standalone_worker import load, run

import indexattn
from indexattn.cli import main
from indexattn.oracle.verify import sample_arguments, sample_sizes
from indexattn.runtime import lib as rt
from indexattn.runtime.standalone import definitions, standalone

HERE = Path(__file__).resolve().parents[1]
GOLDEN = HERE / "golden"
NAMES = sorted(p.stem for p in GOLDEN.glob("*.py"))
# the module's knobs and the runtime's, small enough for blocks at N = 12
KNOBS = {"BLOCK_SCORES": 16, "BLOCK_ROWS": 1, "CHUNK": 4, "DECAY_CHUNK": 4, "QUERY_BLOCK": 4}


def call_of(spec) -> tuple[list, dict]:
    """The arguments and keywords the spec's function is called with on sample data at
    N = 12, but for the per-shape constants (each form builds its own)."""
    fixed = {"N": 12} if "N" in spec.ir.size_asciis else {}
    sizes = sample_sizes(spec.ir, 0, fixed)
    given = {k: v for k, v in sizes.items() if k in spec.required}
    seen, function = {}, spec.function
    spec.function = lambda *args, **kwargs: seen.update(args=args, kwargs=kwargs)
    try:
        spec(**sample_arguments(spec.ir, sizes), **given)
    finally:
        spec.function = function
    kwargs = {k: v for k, v in seen["kwargs"].items() if k != "constants"}
    return list(seen["args"]), kwargs


def same_bits(got, want) -> bool:
    if type(got) is not type(want) or len(got) != len(want):
        return False
    return all(
        g.dtype == w.dtype
        and g.shape == w.shape
        and torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8))
        for g, w in zip(got, want)
    )


@pytest.mark.slow
def test_every_golden_runs_standalone_without_indexattn_bit_for_bit(tmp_path, monkeypatch):
    cases, want = {}, {}
    monkeypatch.setattr(rt, "QUERY_BLOCK", KNOBS["QUERY_BLOCK"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name in NAMES:
            spec = indexattn.compile_spec(name)
            source = (GOLDEN / f"{name}.py").read_text(encoding="utf-8")
            assert spec.source == source
            args, kwargs = call_of(spec)
            function = spec.plain.function
            want[name] = run(load(source, name, KNOBS)[function], args, kwargs)
            cases[name] = (spec.standalone_source, function, KNOBS, args, kwargs)
    finally:
        torch.set_num_threads(threads)
    cases["imported"] = ((GOLDEN / "softcap_window.py").read_text(), "softcap_window", {}, [], {})
    torch.save(cases, tmp_path / "cases.pt")
    worker = HERE / "standalone_worker.py"
    subprocess.run(
        [sys.executable, str(worker), str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
        check=True,
        timeout=600,
    )
    got = torch.load(tmp_path / "out.pt")
    assert got.pop("imported") == "ModuleNotFoundError"  # the twin: indexattn is not there
    assert sorted(got) == NAMES
    assert [name for name in NAMES if not same_bits(got[name], want[name])] == []
    # the twin of the comparison: one bit of one output flipped is seen
    flipped = [t.clone() for t in want["mha"]]
    flipped[0].view(-1).view(torch.uint8)[0] ^= 1
    assert not same_bits(flipped, want["mha"])


def test_the_standalone_form_is_the_imported_form_with_the_runtime_inlined():
    """The module's own lines are the imported form's; each inlined definition is the
    runtime's text exactly (read from its file, runtime/lib.py); only what is called, and what
    that calls, is inlined. The twin: a module importing no runtime stays as it is."""
    spec = indexattn.compile_spec("softcap_window")
    alone = spec.standalone_source
    lib = (Path(rt.__file__)).read_text(encoding="utf-8")
    defined, _ = definitions()
    inlined = {name for name, d in defined.items() if d.text in alone}
    assert inlined == {"HOST_READS", "QUERY_BLOCK", "key_spans", "safe_softmax", "pieces"} | {
        "each_block",
        "Blocks",
        "block_rows",
        "by_blocks",
    }
    assert all(defined[name].text in lib for name in inlined)
    body = spec.source.split("from indexattn.runtime import lib as rt\n")
    assert len(body) == 2 and alone.startswith(body[0]) and alone.endswith(body[1])
    assert "import indexattn" not in alone and "from indexattn" not in alone
    plain = indexattn.compile_spec("mha_math").source
    assert "rt." not in plain and standalone(plain) == plain


def test_a_module_name_the_runtime_defines_is_refused():
    """A spec named after a runtime function it calls would define that name twice."""
    spec = indexattn.compile_spec("softcap_window")
    clashing = spec.source.replace("def softcap_window(", "def by_blocks(")
    with pytest.raises(ValueError, match="by_blocks twice"):
        standalone(clashing)
    standalone(spec.source.replace("def softcap_window(", "def softcap_window_2("))


def test_the_command_line_writes_the_standalone_form(tmp_path, capsys):
    assert main(["compile", "softcap_window", "--standalone"]) == 0
    assert capsys.readouterr().out == indexattn.compile_spec("softcap_window").standalone_source
