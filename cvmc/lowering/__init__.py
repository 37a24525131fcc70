"""Lowering: graph -> TE/TIR. Importing this package does not import TVM."""
