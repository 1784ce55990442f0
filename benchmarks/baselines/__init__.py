"""Independent baselines: the best PyTorch a skilled engineer writes for a computation, each
in its own module, written from the paper's or the library's algorithm, not from a spec or a
reference module of tests/. Each takes the spec module's parameters by name (so one set of
weights serves both) and says in its docstring why it is the best a user would write.
benchmarks/independent.py times them against the generated modules."""
