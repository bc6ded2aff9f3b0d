"""``python -m cuzkd``: the same entry point as the ``cuzkd`` console script."""

import sys

from cuzkd.cli import main

sys.exit(main())
