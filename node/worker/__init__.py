"""The runner process itself (sync, no trio; ``python -m node.worker --runner``): its start,
signals and exit (process.py), its loop (loop.py, which takes jobs), split by the state each
part owns: the running job (job.py), a batch of them (batch.py), ending attempts and what the
process reports of them, its log lines too (ending.py)."""
