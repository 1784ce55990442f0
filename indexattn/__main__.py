"""`python -m indexattn`: the command line, as the `indexattn` script runs it."""

import sys

from .cli import main

sys.exit(main())
