"""``python -m node.cli``: the same as the ``hero-node`` command."""

from node.cli.main import main

raise SystemExit(main())
