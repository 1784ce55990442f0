"""The program the planner makes and every pass takes and returns: its steps, each kind's
facts, the numerics policy, and the passes (`passes/`), each `Program -> Program`."""
