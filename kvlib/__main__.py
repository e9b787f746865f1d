"""``python -m kvlib``: the same as the ``kvlib`` command."""

import os
import sys

from kvlib.cli import main

try:
    sys.exit(main())
except BrokenPipeError:
    # The reader (e.g. `| head`) went away: stop quietly, as Unix tools do.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
