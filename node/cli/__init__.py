"""``hero-node``, the command line: :func:`main` parses and dispatches (node/cli/main.py)."""

from node.cli.main import main

__all__ = ["main"]
