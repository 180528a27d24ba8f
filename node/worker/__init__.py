"""The runner process itself (sync, no trio; ``python -m node.worker --runner``): its loop
(loop.py), split by the state each part owns: taking jobs (popping.py), the running job
(job.py), ending attempts (ending.py), what it reports (reports.py); its log lines (log.py)."""
