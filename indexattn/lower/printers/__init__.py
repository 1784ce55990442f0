"""Program -> Python source: the module's printer (`codegen`), each step kind's lines, the
rows' and tables' functions, and every name from one allocator (`naming`)."""
