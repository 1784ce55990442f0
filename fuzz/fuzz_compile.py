"""Coverage-guided fuzzing of compile_spec: every input compiles or raises SpecError.

    .venv/bin/pip install -c constraints.txt -e ".[fuzz]"
    .venv/bin/python fuzz/fuzz_compile.py fuzz/corpus -dict=fuzz/attn.dict -runs=120000

libFuzzer prints the number of inputs run ("#N DONE"); a crash leaves the input in crash-*.
Anything other than SpecError escaping compile_spec (including from the generated code's
exec) is a crash; so is a compile slower than a second (-timeout=1).
"""

import contextlib
import sys

import atheris
import torch  # noqa: F401 - imported uninstrumented, before the code under test

with atheris.instrument_imports(include=["indexattn"]):
    import indexattn
    from indexattn.runtime import compiled


def one_input(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace") + "\n"  # text, never a path
    with contextlib.suppress(indexattn.SpecError):
        indexattn.compile_spec(text, name="fuzz")
    if len(compiled._CACHE) > 1000:  # keep memory flat over a long campaign
        compiled._CACHE.clear()


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
