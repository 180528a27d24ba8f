"""The node's HTTP server and its live web console.

Rooms: ``settings.py`` (the ``[console]`` table), ``server.py`` (the serving task: hypercorn's
trio worker on a socket bound here), ``console.py`` (the Starlette app: routes, the live feed
as server-sent events, the operator actions), ``feed.py`` (what the page shows, read from the
node's memory and its Valkey), ``recent.py`` (finding the newest jobs, flows and messages
without an index), ``static/`` (the page).
"""
