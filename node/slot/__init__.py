"""The contract of a runner slot, shared by its two sides: the node's (node/runners/, trio),
which starts, watches and recovers the slot's process, and the process's (node/worker/, sync),
which pops, runs and ends its jobs. Both import this room; neither imports the other.

What the node tells the process at its start (spec.py), a job's outcome: how its exit becomes
one and where it waits on disk for adoption (outcomes.py), how a job's command line is built
(commands.py), its output files, followed live and read back (joblogs.py), and what happens to
a job after an attempt: the one plan that ends every attempt and the retry policy it applies
(lifecycle.py). Standard library and bus/ only: no trio here."""

# The modules of this room are imported by their own names; the package re-exports none.
__all__: list[str] = []
