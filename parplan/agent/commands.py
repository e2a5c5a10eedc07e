"""CLI subcommands of the validation agent (``validate``, ``agent``); registered by :mod:`parplan.cli`."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the agent's subcommands to ``sub``; each sets ``handler`` with ``set_defaults``."""
