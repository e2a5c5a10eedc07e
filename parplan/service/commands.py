"""CLI subcommands of the service (``serve``, ``worker``, ``db``, ``token``); registered by
:mod:`parplan.cli`. Each entry maps a subcommand name to its handler."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the service's subcommands to ``sub``; each sets ``handler`` with ``set_defaults``."""
