#!/usr/bin/env python3
"""Builds the wheel of python/ (pip wheel, scikit-build-core, CPU engine), checks what it
holds, installs it into a scratch directory and imports it there with no FATTN_LIBRARY and
no source tree on the path: the library it loads must be the one inside the package.

    python3 python/tests/wheel_check.py [WORK_DIR]

Exit 77 (ctest: skipped) without pip or scikit-build-core: the build runs without build
isolation (no download), with the scikit-build-core of this Python."""
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)


def main():
    for m in ("pip", "scikit_build_core"):
        try:
            __import__(m)
        except ImportError:
            print("SKIP: %s is not installed" % m)
            return 77
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="fattn_wheel_")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    dist, target = os.path.join(work, "dist"), os.path.join(work, "site")
    env = {k: v for k, v in os.environ.items() if k not in ("FATTN_LIBRARY", "PYTHONPATH")}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", dist,
                    "-C", "cmake.define.FATTN_ENABLE_CUDA=OFF", "-C", "build-dir=" + os.path.join(work, "build"),
                    PYDIR], check=True, env=env)
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    names = zipfile.ZipFile(os.path.join(dist, wheels[0])).namelist()
    print(wheels[0], sorted(names))
    for want in ("fattn/__init__.py", "fattn/_capi.py", "fattn/_torch.py", "fattn/hf.py", "fattn/libfattn.so",
                 "fattn/_build_config.py", "fattn/LICENSE"):
        assert want in names, "the wheel lacks %s" % want
    stray = [n for n in names if not (n.startswith("fattn/") or ".dist-info/" in n)]
    assert not stray, "files outside the package: %s" % stray
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", target,
                    os.path.join(dist, wheels[0])], check=True, env=env)
    code = ("import fattn, os; print(fattn.__version__, fattn.library_path, fattn.built_with_cuda); "
            "assert fattn.library_path == os.path.join(os.path.dirname(fattn.__file__), 'libfattn.so'); "
            "assert fattn.built_with_cuda is False; "
            "c = fattn.Context(fattn.BACKEND_CPU); print('context', c.backend)")
    r = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=target), cwd=work)
    if r.returncode != 0:
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("wheel_check: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
