"""The one door to storage: the connection and its error translation; atomic/ (Lua + calls)."""

# The logger of the Redis client library behind this door: the node's log settings quiet it
# (node/observe/logs.py) without naming the library outside bus/store.
CLIENT_LOGGER = "coredis"
