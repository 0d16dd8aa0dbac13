#!/usr/bin/env python3
"""A user's translation unit (user_tu.cpp) must compile without a warning under the flags a user
builds with: -O2 -march=native -Wall -Wextra, with -Werror here, under the build's compiler and
clang++ when there is one (g++ >= 12 and clang >= 14). The include directories and defines are
those of a reference translation unit of the build (tests/compile_flags.py).

usage: run.py --compile-commands FILE --reference SOURCE_NAME [--compiler CXX]...
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from compile_flags import include_and_define_flags, reference_flags  # noqa: E402

USER_FLAGS = ["-std=c++20", "-O2", "-march=native", "-Wall", "-Wextra", "-Werror"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-commands", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--compiler", action="append", default=[],
                    help="another compiler to try when it is installed (clang++-14, clang++)")
    args = ap.parse_args()
    cwd, compiler, flags = reference_flags(args.compile_commands, args.reference)
    incs, host = include_and_define_flags(flags)
    extra = [c for c in args.compiler if shutil.which(c)]
    compilers = [compiler] + [[shutil.which(extra[0])]] if extra else [compiler]
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "user_tu.cpp")
    failed = 0
    for cxx in compilers:
        cmd = cxx + USER_FLAGS + host + incs + ["-c", source, "-o", os.devnull]
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
        version = subprocess.run(cxx + ["--version"], capture_output=True, text=True).stdout.splitlines()[0]
        warnings = r.stderr.count("warning:") + r.stderr.count("error:")
        if r.returncode != 0:
            failed += 1
            print(f"FAIL {version}: {warnings} warnings or errors under {' '.join(USER_FLAGS)}; the first:\n{r.stderr[:6000]}")
        else:
            print(f"ok   {version}: no warning under {' '.join(USER_FLAGS)} ({time.time() - t0:.0f} s)")
    if not extra:
        print(f"(no {' or '.join(args.compiler)} here: only {compiler[0]} checked)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
