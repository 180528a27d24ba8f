"""Running jobs: runner slots and their queues, leases and attempts, script execution, warm
python workers, presence, and the external runner protocol."""

# The modules of this room are imported by their own names; the package re-exports none.
__all__: list[str] = []
