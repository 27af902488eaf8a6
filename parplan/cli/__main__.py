"""``python -m parplan.cli``: the same as the ``parplan`` command."""

import sys

from parplan.cli import main

if __name__ == "__main__":
    sys.exit(main())
