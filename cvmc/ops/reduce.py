"""CVM reduce operators (see ../shared/spec/cvm-operators-formal.txt)."""
