"""The ``[tracing]`` table of config.toml: where the node's spans go, how many, under which name.

Kept apart from the tracing code (node/observe/tracing.py) so that reading a configuration never
imports the OpenTelemetry SDK: a node with tracing off never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import tomli_w

from node.errors import ConfigError


@dataclass(frozen=True)
class TracingConfig:
    """``endpoint``: the OTLP/HTTP traces URL (e.g. ``http://127.0.0.1:4318/v1/traces``; "" :
    tracing off, the default); ``sampling_ratio``: the share of traces this node records, 0 to
    1; ``service_name``: the ``service.name`` of its spans; ``sampling_key``: nodes that share
    it record the same traces (see node/observe/tracing.py; "" : a key of this start only)."""

    endpoint: str = ""
    sampling_ratio: float = 1.0
    service_name: str = "hero-node"
    sampling_key: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint)


_TYPES: dict[str, type | tuple[type, ...]] = {
    "endpoint": str,
    "sampling_ratio": (int, float),
    "service_name": str,
    "sampling_key": str,
}


def parse_tracing(raw: object) -> TracingConfig:
    """The ``[tracing]`` table as a TracingConfig; ConfigError names what is wrong."""
    if not isinstance(raw, dict):
        raise ConfigError("[tracing] must be a table")
    unknown = set(raw) - set(_TYPES)
    if unknown:
        raise ConfigError(f"unknown [tracing] setting(s): {', '.join(sorted(unknown))}")
    for name, kind in _TYPES.items():
        if name in raw and (not isinstance(raw[name], kind) or isinstance(raw[name], bool)):
            raise ConfigError(f"[tracing] {name} has the wrong type ({raw[name]!r})")
    config = TracingConfig(**raw)
    if not 0.0 <= config.sampling_ratio <= 1.0:
        raise ConfigError(f"[tracing] sampling_ratio is 0 to 1 (got {config.sampling_ratio})")
    if config.endpoint:
        parts = urlsplit(config.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"[tracing] endpoint wants an http(s) URL of an OTLP/HTTP traces receiver, "
                f"got {config.endpoint[:80]!r}"
            )
    if not config.service_name:
        raise ConfigError("[tracing] service_name may not be empty")
    return config


def render_tracing(tracing: TracingConfig) -> str:
    """The ``[tracing]`` table ``hero-node init`` writes, commented (off: no endpoint)."""
    table: dict[str, object] = {
        "sampling_ratio": tracing.sampling_ratio,
        "service_name": tracing.service_name,
    }
    if tracing.endpoint:
        table["endpoint"] = tracing.endpoint
    return (
        "# OpenTelemetry spans of this node, exported over OTLP/HTTP (docs/operate/tracing.md);\n"
        '# off unless endpoint is set, e.g. endpoint = "http://127.0.0.1:4318/v1/traces"\n'
        + tomli_w.dumps({"tracing": table})
    )
