"""``python -m optima_trainers.train``: run or resume a training run (see :mod:`optima_trainers.cli`)."""

from __future__ import annotations

import sys

from optima_trainers.cli import main

if __name__ == "__main__":
    sys.exit(main())
