"""``python -m edge_agent.cli``: the ``edge-agent`` command."""

import sys

from edge_agent.cli.commands import main

sys.exit(main())
