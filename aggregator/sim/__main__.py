"""``python -m aggregator.sim ...``: the same program as ``aggregator simulate ...``."""

import sys

from aggregator.sim.cli import main

sys.exit(main())
