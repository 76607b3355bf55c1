"""``python -m optima_trainers.train``: run or resume a training run (see :mod:`optima_trainers.cli.train`)."""

from __future__ import annotations

import sys

from optima_trainers.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
