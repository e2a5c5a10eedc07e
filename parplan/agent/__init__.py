"""Validation agent: runs plans with torch.distributed and reports only what it measured."""
