#!/usr/bin/env python3
"""Compiles the probe and each given header alone with `nvcc -std=c++20 -x cu` (no GPU needed).

usage: nvcc_headers.py NVCC INCLUDE_DIR PROBE.cpp HEADER...
"""
import os
import subprocess
import sys
import tempfile


def nvcc(nvcc_path, include, source, workdir):
    cmd = [nvcc_path, "-std=c++20", "-x", "cu", "-I" + include, "-c", source, "-o", os.path.join(workdir, "out.o")]
    return subprocess.run(cmd, capture_output=True, text=True)


def main():
    nvcc_path, include, probe, headers = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    failed = 0
    with tempfile.TemporaryDirectory() as work:
        jobs = [("probe", probe)]
        for h in headers:
            tu = os.path.join(work, os.path.basename(h) + ".cu.cpp")
            with open(tu, "w") as f:
                f.write(f'#include "{os.path.abspath(h)}"\nint main() {{ return 0; }}\n')
            jobs.append((os.path.basename(h), tu))
        for name, source in jobs:
            r = nvcc(nvcc_path, include, source, work)
            ok = r.returncode == 0
            failed += not ok
            print(("PASS " if ok else "FAIL ") + name + ("" if ok else "\n" + r.stdout[-3000:] + r.stderr[-3000:]))
    print(f"{len(jobs) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
