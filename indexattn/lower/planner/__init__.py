"""Spec -> Program: the planner and its rules (the canonical form first, then the fused
kernels, products, prefix sums, decays, sinks, scatters, convolutions, stacks and masks)."""
