#!/usr/bin/env python3
"""The ```cpp blocks of the README and docs/, as sources the build compiles (tests/meson.build).

  docs_snippets.py --list FILE.md...          one line per block: "<id> <has_main 0|1> <file>"
  docs_snippets.py --extract ID FILE.md OUT   writes block ID of FILE.md to OUT

A block with no #include gets `#include <shardlib/shardlib.hpp>` in front (README fragments).
A block's `int main` gets a `return 0;` at the end of its body: the same program, and a well-defined
one when tests/unity.py compiles the block as a function of a namespace (only ::main may end
without a return). Ids are <file stem>_<n>, the file's n-th block (from 1): editing the prose
around the blocks renames no test, and a build that was configured before the edit still finds
its blocks (tests/meson.build reconfigures by itself when a page changes). A compiler's message
about a block names the page and its line (a #line directive).
"""
import os
import re
import sys


def shown_name(path):
    """How a message names PATH: docs/NAME.md for a page of docs/, else the file's name."""
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return f"{parent}/{os.path.basename(path)}" if parent == "docs" else os.path.basename(path)


def blocks(path):
    """(id, code) of each ```cpp block of PATH, the code starting with a #line directive that
    points at the page's line (after the #include it may get)."""
    text = open(path, encoding="utf-8").read()
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    for n, m in enumerate(re.finditer(r"```cpp\n(.*?)```", text, re.S), start=1):
        first = text.count("\n", 0, m.start()) + 2  # the line after the fence
        code = f'#line {first} "{shown_name(path)}"\n' + m.group(1)
        if "#include" not in m.group(1):
            code = "#include <shardlib/shardlib.hpp>\n" + code
        yield f"{stem}_{n}", code


def end_of_main(code):
    """The index of the closing brace of `int main`'s body in CODE, or None without a main."""
    m = re.search(r"\bint\s+main\s*\(", code)
    if not m:
        return None
    depth, i, opened = 0, m.end(), False
    while i < len(code):
        c = code[i]
        if code.startswith("//", i):
            i = code.find("\n", i)
            if i < 0:
                break
        elif code.startswith("/*", i):
            i = code.find("*/", i) + 1
        elif c in "\"'":  # a string or character literal, with its escapes
            i += 1
            while i < len(code) and code[i] != c:
                i += 2 if code[i] == "\\" else 1
        elif c == "{":
            depth, opened = depth + 1, True
        elif c == "}":
            depth -= 1
            if opened and depth == 0:
                return i
        i += 1
    raise SystemExit("docs_snippets.py: the braces of main do not match in a block")


def with_return(code):
    end = end_of_main(code)
    return code if end is None else code[:end] + "  return 0;\n" + code[end:]


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
                    f.write(with_return(code))
                return 0
        print(f"no block {ident} in {path}: the page has fewer blocks than when the build was configured "
              "(meson setup --reconfigure)", file=sys.stderr)
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
