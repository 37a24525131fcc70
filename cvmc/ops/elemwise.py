"""CVM elemwise operators (see ../shared/spec/cvm-operators-formal.txt)."""
