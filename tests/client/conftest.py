"""Make the in-process cluster helpers importable as ``client_cluster`` from this folder's tests."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
