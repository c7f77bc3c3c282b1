"""Helpers shared by the ground-truth scripts (tools/torch_*.py): the code is the package's
python/membudget/torch_common.py, imported here from the checkout without the compiled core."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "membudget"))
from torch_common import *  # noqa: E402,F401,F403
