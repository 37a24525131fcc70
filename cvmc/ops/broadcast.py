"""CVM broadcast operators (see ../shared/spec/cvm-operators-formal.txt)."""
