"""What the node shows of itself: metrics, counters, logs, the dead-letter watcher, link info."""
