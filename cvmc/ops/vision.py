"""CVM vision operators (see ../shared/spec/cvm-operators-formal.txt)."""
