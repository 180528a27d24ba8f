"""The node's side of running jobs (trio): supervising the runner processes (processes.py),
recovering their slots and scheduling retries (recovery.py), adopting what a dead node's jobs
finished (adoption.py), presence, and the external runner protocol; what the node tells a
runner process at its start (spec.py). The runner process itself is node/worker/, which imports
this room's sync helpers (spec, outcomes, exits, lifecycle, commands, joblogs); this room imports
nothing of it."""

# The modules of this room are imported by their own names; the package re-exports none.
__all__: list[str] = []
