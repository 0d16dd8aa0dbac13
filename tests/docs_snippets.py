#!/usr/bin/env python3
"""The ```cpp blocks of the README and docs/, as sources the build compiles (tests/meson.build).

  docs_snippets.py --list FILE.md...          one line per block: "<id> <has_main 0|1> <file>"
  docs_snippets.py --extract ID FILE.md OUT   writes block ID of FILE.md to OUT

A block with no #include gets `#include <shardlib/shardlib.hpp>` in front (README fragments).
Ids are <file stem>_<line of the opening fence>.
"""
import os
import re
import sys


def blocks(path):
    text = open(path, encoding="utf-8").read()
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    for m in re.finditer(r"```cpp\n(.*?)```", text, re.S):
        line = text.count("\n", 0, m.start()) + 1
        code = m.group(1)
        if "#include" not in code:
            code = "#include <shardlib/shardlib.hpp>\n" + code
        yield f"{stem}_{line}", code


def main():
    if sys.argv[1] == "--list":
        for path in sys.argv[2:]:
            for ident, code in blocks(path):
                print(ident, int("int main(" in code), path)
        return 0
    if sys.argv[1] == "--extract":
        ident, path, out = sys.argv[2:5]
        for i, code in blocks(path):
            if i == ident:
                with open(out, "w", encoding="utf-8") as f:
                    f.write(f'#line 1 "{os.path.basename(path)}:{ident}"\n' + code)
                return 0
        print(f"no block {ident} in {path} (reconfigure after editing the docs)", file=sys.stderr)
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
