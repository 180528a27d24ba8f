"""Shell completion for ``hero-node`` (argcomplete): commands, actions, options and choices.

``hero-node completion bash`` prints the shell code to ``eval`` (in ~/.bashrc:
``eval "$(hero-node completion bash)"``); zsh and fish likewise. When the shell asks for
completions it runs ``hero-node`` with argcomplete's environment set: :func:`complete` then
answers from the parser and exits before any command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

import argcomplete

SHELLS = ("bash", "zsh", "fish")


def complete(parser: argparse.ArgumentParser) -> None:
    """Answer a shell's completion request and exit; returns at once on any other run."""
    argcomplete.autocomplete(parser)


def add_completion_command(sub: Any) -> None:  # noqa: ANN401 (argparse's private type)
    s = sub.add_parser(
        "completion",
        help='print the shell code that enables completion: eval "$(hero-node completion bash)"',
    )
    s.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    s.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    print(argcomplete.shellcode(["hero-node"], shell=args.shell), end="")
    return 0
