"""IR -> Python: the patterns one PyTorch call computes (fusion), the ordered steps (plan),
the names and the source text (codegen)."""
