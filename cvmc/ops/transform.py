"""CVM transform operators (see ../shared/spec/cvm-operators-formal.txt)."""
