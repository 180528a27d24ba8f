"""The wire between nodes: the websocket transport, durable per-peer outboxes, link state."""
