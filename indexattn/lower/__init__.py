"""IR -> Python: the lowering stage, from a checked `Spec` to the generated module's source.

Four rooms, each importing only those before it (tests/project/test_layers.py; docs/architecture.md
draws them):

- **program/** (`program.py`, `steps.py`, `kinds.py`, `numerics.py`): what the planner makes
  and every pass takes and returns, frozen and printable; each step kind's facts in one table
  (`kinds.py`), the numerics policy (`numerics.py`);
- **planner/** (`canonical.py`, then `plan.py` with its rules: the kernels matched in
  `fusion.py`/`kernels.py`, the products in `products.py` and `order.py`, prefix sums,
  decays, sinks, scatters, convolutions, stacks, masks): the `Spec` becomes a `Program`;
- **program/passes/**: each `Program -> Program`, computing the same values; their order is
  `passes.PASSES` (the one list; `indexattn compile SPEC --dump-after PASS` prints the program
  after any of them, and tests/lower/test_passes.py runs it against the oracle);
- **printers/** (`codegen.py`, `emit.py`, `kernels_emit.py`, `tables_emit.py`): the final
  program as Python, one operation per line, every name from one allocator (`naming.py`);
  each step kind's printer a function `@prints(Kind)` of a frozen `Context` (`values.py`),
  the attention core's by its backend (indexattn/backends/: `sdpa/emit.py`, the blocked
  rows' function in `blocks/emit.py`, `flex/emit.py`). The printer decides nothing a pass
  could: it reads the program.

`pipeline.pipeline(spec)` runs the canonical form, the planner and the passes, the one way
the runtime, the command line and the tests take (`pipeline(spec, after=STAGE)` stops at any).
"""
