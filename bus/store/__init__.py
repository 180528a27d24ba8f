"""The one door to storage: the connection and its error translation; atomic/ (Lua + calls)."""
