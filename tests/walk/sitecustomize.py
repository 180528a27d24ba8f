"""Run at every interpreter start with this directory on PYTHONPATH (modulewalk.py)."""

import modulewalk

modulewalk.install_from_env()
