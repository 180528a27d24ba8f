"""Flows at their origin node: the engine that releases jobs as prerequisites finish, and the
checks on actor-signed flow documents and node-signed flow jobs."""

# The modules of this room are imported by their own names; the package re-exports none.
__all__: list[str] = []
