#!/usr/bin/env python3
"""Measure the GPU memory of real PyTorch training steps (the ground truth): the code is the
package's python/membudget/torch_step.py, which `python -m membudget measure` runs too; see its
docstring for the phases, recipes and matrix files. This script runs it from a checkout, without
the compiled core (the GPU machine's Python need not have it)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "membudget"))
from torch_step import *  # noqa: E402,F401,F403
from torch_step import SNAPSHOT, SNAPSHOT_DIR, main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
