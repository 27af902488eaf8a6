"""``python -m parplan.cli``: the same as the ``parplan`` command."""

import sys

from parplan.cli import main

sys.exit(main())
