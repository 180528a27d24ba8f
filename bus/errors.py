"""Exceptions raised by the bus package (the public name; they are defined in bus/core/errors.py,
beside the pure code that raises most of them, so that bus/core imports nothing above it)."""

from bus.core.errors import (
    BusError,
    ClientError,
    ContentError,
    FlowError,
    FrameError,
    HandshakeError,
    ModelError,
    Refused,
    StoreError,
    TransportError,
)

__all__ = [
    "BusError",
    "ClientError",
    "ContentError",
    "FlowError",
    "FrameError",
    "HandshakeError",
    "ModelError",
    "Refused",
    "StoreError",
    "TransportError",
]
