"""``python -m zctipc ls|gc|doctor``: see :mod:`zctipc.cli`."""

import sys

from .cli import main

sys.exit(main())
