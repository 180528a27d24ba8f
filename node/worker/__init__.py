"""The runner process itself (sync, no trio; ``python -m node.worker --runner``): its start,
signals and exit (process.py), its loop (loop.py, which takes jobs), split by the state each
part owns: the running job (job.py), ending attempts (ending.py), what it reports and its log
lines (reports.py)."""
