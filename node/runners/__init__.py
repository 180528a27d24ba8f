"""The node's side of running jobs (trio): supervising the runner processes (processes.py),
recovering their slots and scheduling retries (recovery.py), adopting what a dead node's jobs
finished (adoption.py), presence, and the external runner protocol. The runner process itself
is node/worker/; what both sides share (the slot's spec, outcomes, exits, the plan that ends an
attempt) is node/slot/. This room imports nothing of node/worker/, nor it of this room."""

# The modules of this room are imported by their own names; the package re-exports none.
__all__: list[str] = []
