"""What the node runs on: embedded Valkey, ACL users, the home, its lock, launching a node."""
