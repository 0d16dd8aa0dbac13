#!/usr/bin/env python3
"""Compiles every ```cpp block of the given Markdown files; blocks with a main() are also run.

A block without an #include gets `#include <shardlib/shardlib.hpp>` in front (README fragments).
usage: docs_snippets.py --include DIR -- CXX [ARGS...] -- FILE.md...
"""
import os
import re
import subprocess
import sys
import tempfile


def blocks(path):
    text = open(path, encoding="utf-8").read()
    for i, m in enumerate(re.finditer(r"```cpp\n(.*?)```", text, re.S)):
        line = text.count("\n", 0, m.start()) + 1
        yield f"{os.path.basename(path)}:{line}", m.group(1)


def main():
    argv = sys.argv[1:]
    first, second = argv.index("--"), argv.index("--", argv.index("--") + 1)
    include = argv[argv.index("--include") + 1]
    cxx, files = argv[first + 1:second], argv[second + 1:]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as work:
        for path in files:
            for where, code in blocks(path):
                if "#include" not in code:
                    code = "#include <shardlib/shardlib.hpp>\n" + code
                src = os.path.join(work, "snippet.cpp")
                exe = os.path.join(work, "snippet")
                open(src, "w").write(code)
                runs = "int main(" in code
                cmd = cxx + ["-std=c++20", "-I" + include, src] + (["-o", exe] if runs else ["-fsyntax-only"])
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode == 0 and runs:
                    r = subprocess.run([exe], capture_output=True, text=True)
                ok = r.returncode == 0
                passed += ok
                failed += not ok
                print(("PASS " if ok else "FAIL ") + where + ("" if ok else "\n" + r.stdout[-3000:] + r.stderr[-3000:]))
    if passed + failed == 0:
        print("no ```cpp blocks found")
        return 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
