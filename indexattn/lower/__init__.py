"""IR -> Python: the lowering stage, from a checked `Spec` to the generated module's source.

Three rooms, in order (docs/architecture.md draws them):

- **planning** (`plan.py`, with the kernels matched in `fusion.py`/`kernels.py` and the
  product rules in `products.py`): the `Spec` becomes a `Program` (`program.py`) of steps
  (`steps.py`), each kind's facts in one table (`kinds.py`);
- **passes** (`passes/`): each `Program -> Program`, computing the same values; their order
  is `passes.PASSES` (the one list; `indexattn compile SPEC --dump-after PASS` prints the
  program after any of them, and tests/test_passes.py runs it against the oracle);
- **printing** (`codegen.py`, `emit.py`, `kernels_emit.py`, `rows_emit.py`): the final
  program as Python, one operation per line, every name from one allocator (`naming.py`).
  The printer decides nothing a pass could: it reads the program.

`pipeline.pipeline(spec)` runs the canonical form, the planner and the passes, the one way
the runtime, the command line and the tests take (`pipeline(spec, after=STAGE)` stops at any).
"""
