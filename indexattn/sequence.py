"""The documented spelling `indexattn.sequence` (docs/distributed.md, examples/): the same module
as indexattn.parallel.sequence, so that patching one patches the other."""

import sys

from .parallel import sequence

sys.modules[__name__] = sequence
