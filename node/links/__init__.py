"""The node's side of its peer links: what it does with their frames, and a breaker per peer."""
