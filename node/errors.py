"""Exceptions raised by the node package."""


class NodeError(Exception):
    """Root of every error raised by node/."""


class ConfigError(NodeError):
    """The node's configuration or data directory is missing or invalid."""
