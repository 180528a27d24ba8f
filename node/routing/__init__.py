"""A message's path through a node: admission, the supervisor (msg_out), the links, the consumer
(msg_in), materialisation, stops and the deadlines of what this node sent."""
