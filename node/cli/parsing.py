"""What every ``hero-node`` parser shares once the command tree is built: defaults in the help,
``--home`` after any command, and a group's help when its action is missing."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

HOME_HELP = "node home directory (default: $HERO_NODE_HOME or ~/.hero-node)"


def home_dir(text: str) -> Path:
    """A home as given (``--home`` or ``$HERO_NODE_HOME``), made absolute against the directory
    the command runs in: the node hands its paths to processes started elsewhere (the embedded
    Valkey runs in its data directory, where ``a/secrets/valkey.acl`` names nothing; bwrap's
    probes), so a relative home must not get past the command line. ``..`` is folded, symlinks
    are kept (the path the user named)."""
    return Path(os.path.abspath(os.path.expanduser(text)))


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and appends an option's default to its help, unless the help
    already says it or the default says nothing (None, False, empty)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, "", []) or default == argparse.SUPPRESS:
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, "*"):
            return text
        return f"{text} (default: %(default)s)"


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hero-node")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class VersionAction(argparse._VersionAction):
    """``--version``, with the package's version looked up only when it is asked for:
    importlib.metadata and its search of the installed packages would cost every run, --help
    and each shell completion too, some 40 ms."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        self.version = f"%(prog)s {package_version()}"
        super().__call__(parser, namespace, values, option_string)


def subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parsers directly under ``parser`` (its commands or actions)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from dict.fromkeys(action.choices.values())  # aliases map to one parser


def walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every parser below it."""
    yield parser
    for child in subparsers(parser):
        yield from walk(child)


def finish(root: argparse.ArgumentParser) -> None:
    """Applies the shared behaviour to every parser below ``root``.

    ``--home`` is repeated on each command (``init`` prints ``hero-node run --home DIR``) with a
    suppressed default, so that the top-level ``--home`` still counts when it is not repeated."""
    for parser in walk(root):
        parser.formatter_class = HelpFormatter
        if parser is root:
            continue
        if any(True for _ in subparsers(parser)):
            parser.set_defaults(func=_group_help(parser))
        else:
            parser.add_argument("--home", type=home_dir, default=argparse.SUPPRESS, help=HOME_HELP)


def _group_help(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def show(_args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2  # a usage error, as argparse exits with: the action is missing

    return show


def hidden_alias(parser: argparse.ArgumentParser, *names: str, **kwargs: object) -> None:
    """An old spelling of an option, still accepted (scripts keep working), not shown in the
    help; ``kwargs`` must name the new spelling's ``dest``."""
    parser.add_argument(*names, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)  # type: ignore[arg-type]
