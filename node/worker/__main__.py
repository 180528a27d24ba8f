"""A runner process's entry: ``python -m node.worker --runner <run dir>``, started by the node
(node/runners/processes.py); the process is node/worker/process.py, its loop
node/worker/loop.py. The run directory on the command line is only what names the node's
runners in ``ps``."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

# redis-py, the runner's store client, imports OpenTelemetry's metrics SDK whenever it is
# installed, for client metrics that only its caller can turn on; a runner never does (what it
# traces goes through the tracing SDK, node/worker/spans.py), and that import was 65 ms of the
# 510 ms each runner spends importing its modules
METRICS_SDK = "opentelemetry.sdk.metrics"


def load_loop() -> Callable[[], None]:
    """The runner loop's ``main``, its modules imported with the metrics SDK absent (redis-py
    then records it as not installed); a later import of the SDK in this process finds it."""
    blocked = METRICS_SDK not in sys.modules
    if blocked:
        sys.modules[METRICS_SDK] = None  # type: ignore[assignment]  # "not installed"
    try:
        from node.worker.process import main as runner_main
    finally:
        if blocked:
            del sys.modules[METRICS_SDK]
    return runner_main


def main() -> None:
    if sys.argv[1:2] != ["--runner"]:
        sys.exit("usage: python -m node.worker --runner RUN_DIR (started by the node)")
    # told to stop while it starts: it has taken nothing yet, so it just goes
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: os._exit(0))
    load_loop()()  # after the handlers: the imports take time


if __name__ == "__main__":
    main()
