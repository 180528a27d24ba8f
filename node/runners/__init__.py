"""Running jobs: runner processes that pop their own queues (their slots, leases and attempts,
script execution, python in a warm interpreter), the node's side of them, presence, and the
external runner protocol."""

# The modules of this room are imported by their own names; the package re-exports none.
__all__: list[str] = []
