"""``python -m edge_agent``: the ``edge-agent`` command."""

import sys

from edge_agent.cli.commands import main

sys.exit(main())
