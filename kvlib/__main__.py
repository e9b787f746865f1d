"""``python -m kvlib``: the same as the ``kvlib`` command."""

import sys

from kvlib.cli import main

sys.exit(main())
