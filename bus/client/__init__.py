"""What programs use to talk to a node: the trio Client (api.py), reply inboxes, ``hero-verify``."""
