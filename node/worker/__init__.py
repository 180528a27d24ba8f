"""The runner process itself (sync, no trio): its loop, one job, its log lines."""
