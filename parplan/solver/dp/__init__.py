"""Galvatron-BMW: per-layer hybrid strategies by dynamic programming, with balanced pipelines."""
