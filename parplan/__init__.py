"""parplan: an automatic parallelism planner for training large models."""

__version__ = "0.1.0"
