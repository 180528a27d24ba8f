"""A message entering a node: supervisor (msg_out), consumer (msg_in), admission, materialise."""
