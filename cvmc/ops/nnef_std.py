"""NNEF 1.0 standard primitives that cvmc parses and shape-checks but does not compile."""
