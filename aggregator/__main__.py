"""``python -m aggregator``: the ``aggregator`` command."""

import sys

from aggregator.cli import main

sys.exit(main())
