#!/usr/bin/env python3
"""ctest's runner of python/tests: run.py [--needs numpy,torch] test_module ...

Exits 77 (ctest: skipped) when a module named by --needs is not installed, else
runs the test modules with unittest and exits 0 when they pass, 1 otherwise, and
77 when every test skipped itself (e.g. test_torch.CudaPortable without a GPU)."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(argv):
    needs = []
    if argv[:1] == ["--needs"]:
        needs, argv = argv[1].split(","), argv[2:]
    for n in needs:
        try:
            __import__(n)
        except ImportError as e:
            print("SKIP: %s is not installed (%s)" % (n, e))
            return 77
    suite = unittest.defaultTestLoader.loadTestsFromNames(argv)
    r = unittest.TextTestRunner(verbosity=2).run(suite)
    if r.wasSuccessful() and r.testsRun > 0 and len(r.skipped) == r.testsRun:
        return 77
    return 0 if r.wasSuccessful() and r.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
