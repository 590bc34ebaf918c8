"""Test set-up shared by python/tests: import fattn from this source tree's python/
(FATTN_TEST_INSTALLED=1: the installed package instead), and float64 references."""
import os
import sys

if not os.environ.get("FATTN_TEST_INSTALLED"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def have(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False
