"""The contract of a runner slot, shared by its two sides: the node's (node/runners/, trio),
which starts, watches and recovers the slot's process, and the process's (node/worker/, sync),
which pops, runs and ends its jobs. Both import this room; neither imports the other.

What the node tells the process at its start (spec.py), a job's outcome on disk: its output
files, followed live and read back, the limit that ended it, and where the outcome waits for
adoption (outcomes.py), how a job's command line is built (commands.py), and the wait while
Valkey is away (away.py). How an attempt ends, its outcome and the one plan, is pure and lives
in bus/core/attempts.py. Standard library and bus/ only: no trio here."""

# The modules of this room are imported by their own names; the package re-exports none.
__all__: list[str] = []
