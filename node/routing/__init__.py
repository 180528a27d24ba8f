"""A message's path through a node: admission, the supervisor (msg_out), the links, the consumer
(msg_in), materialisation, stops and the deadlines of what this node sent."""

# The modules of this room are imported by their own names; the package re-exports none.
__all__: list[str] = []
