"""ILP search for minimal-memory intra-operator strategies (the memory-redundancy paper)."""
