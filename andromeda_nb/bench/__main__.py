"""``python -m andromeda_nb.bench <suite> [options]``: run a benchmark suite on a GPU."""

import sys

from .harness import main

sys.exit(main())
