"""The runner process itself (sync, no trio; ``python -m node.worker --runner``): its loop
(loop.py, which takes jobs), split by the state each part owns: the running job
(job.py), ending attempts (ending.py), what it reports (reports.py); its log lines (log.py)."""
