#!/usr/bin/env python3
"""Compiles the probe and the given headers with `nvcc -std=c++20 -x cu` (no GPU needed): nvcc's
front end re-emits class-type template arguments and constant expressions in its own way, and
this is where that breaks. The headers go into one translation unit (each header alone is
checked by the host compiler's self-contained test); when it fails, each header is compiled
alone to name the one at fault.

usage: nvcc_headers.py NVCC INCLUDE_DIR PROBE.cpp HEADER...
"""
import os
import subprocess
import sys
import tempfile


def nvcc(nvcc_path, include, source, workdir):
    cmd = [nvcc_path, "-std=c++20", "-x", "cu", "-I" + include, "-c", source, "-o", os.path.join(workdir, "out.o")]
    return subprocess.run(cmd, capture_output=True, text=True)


def tu_of(headers, path):
    with open(path, "w") as f:
        for h in headers:
            f.write(f'#include "{os.path.abspath(h)}"\n')
        f.write("int main() { return 0; }\n")
    return path


def report(name, r):
    ok = r.returncode == 0
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else "\n" + r.stdout[-3000:] + r.stderr[-3000:]))
    return ok


def main():
    nvcc_path, include, probe, headers = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    failed = 0
    with tempfile.TemporaryDirectory() as work:
        failed += not report("probe", nvcc(nvcc_path, include, probe, work))
        together = nvcc(nvcc_path, include, tu_of(headers, os.path.join(work, "all.cu.cpp")), work)
        if report(f"{len(headers)} headers in one translation unit", together):
            print("headers: " + ", ".join(os.path.relpath(h, include) for h in headers))
        else:
            failed += 1
            for h in headers:  # name the header(s) at fault
                report(os.path.relpath(h, include) + " alone",
                       nvcc(nvcc_path, include, tu_of([h], os.path.join(work, "one.cu.cpp")), work))
    print("nvcc headers: " + ("all compile" if failed == 0 else f"{failed} check(s) failed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
