"""A runner process's entry: ``python -m node.worker --runner <run dir>``, started by the node
(node/runners/processes.py); the loop is node/worker/loop.py. The run directory on the command
line is only what names the node's runners in ``ps``."""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    if sys.argv[1:2] != ["--runner"]:
        sys.exit("usage: python -m node.worker --runner RUN_DIR (started by the node)")
    # told to stop while it starts: it has taken nothing yet, so it just goes
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: os._exit(0))
    from node.worker.loop import main as runner_main  # after the handlers: imports take time

    runner_main()


if __name__ == "__main__":
    main()
