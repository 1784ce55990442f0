"""The literal interpreter, and generated code compared against it on random data."""
