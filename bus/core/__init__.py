"""The I/O-free core of the bus: models, keys, reasons, envelope, verify, frames, dag, ids, urls."""
