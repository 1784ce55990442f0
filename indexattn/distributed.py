"""The documented spelling `indexattn.distributed` (docs/distributed.md, examples/): the same module
as indexattn.parallel.distributed, so that patching one patches the other."""

import sys

from .parallel import distributed

sys.modules[__name__] = distributed
