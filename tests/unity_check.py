#!/usr/bin/env python3
"""tests/unity.py and tests/docs_snippets.py's main: two sources with the same names compile as one
translation unit, each keeps its own; a conditional #include stays conditional; one program runs
each source's main by name (argv passed on, return values kept, an unknown name refused); a docs
block's main gets its `return 0;` past braces in strings, characters and comments.

  unity_check.py COMPILER
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

A = """#include <string>
static int twice(int x) { return 2 * x; }   // B has a twice too, and a different one
int main() { return twice(3) == 6 && std::string("a").size() == 1 ? 0 : 1; }
"""
B = """#if defined(UNITY_CHECK_NEVER)
#include <this_header_does_not_exist.h>
#endif
#include <cstring>
namespace { int twice(int x) { return x + x + 1; } }
int main(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[1], "x") != 0 || std::strcmp(argv[2], "y") != 0) return 4;
  return twice(1) == 3 ? 5 : 1;  // 5: the return value comes back
}
"""
C = "int used_by_nothing() { return 7; }\n"  # no main: compiled, not a program
BLOCK = """# A page

```cpp
#include <cstdio>
int main(int argc, char**) {
  const char* s = "}{ \\" }";  // a } in a comment
  /* { */
  if (argc > 5) { std::printf("%s %c\\n", s, '}'); }
}
```
"""


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    cxx = sys.argv[1]
    failures = []

    def expect(what, ok, detail=""):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)
            if detail:
                print(detail)

    with tempfile.TemporaryDirectory() as d:
        for name, text in (("a.cpp", A), ("b.cpp", B), ("c.cpp", C), ("page.md", BLOCK)):
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        unity = os.path.join(d, "all.cpp")
        r = run([sys.executable, os.path.join(HERE, "unity.py"), "--root", d, "--programs", unity] +
                [os.path.join(d, n) for n in ("a.cpp", "b.cpp", "c.cpp")])
        expect("unity.py writes the translation unit", r.returncode == 0, r.stderr)
        prog = os.path.join(d, "all")
        r = run([cxx, "-std=c++20", "-Wall", "-Werror", "-I", d, unity, "-o", prog])
        expect("two sources with the same names compile as one unit", r.returncode == 0, r.stderr)
        if r.returncode == 0:
            expect("a's main runs, with a's twice", run([prog, "a"]).returncode == 0)
            expect("b's main gets its arguments and returns its value", run([prog, "b", "x", "y"]).returncode == 5)
            bad = run([prog, "c"])
            expect("a source without a main is no program", bad.returncode == 2 and "a b" in bad.stderr, bad.stderr)
            expect("no name: the usage, exit 2", run([prog]).returncode == 2)

        listed = run([sys.executable, os.path.join(HERE, "docs_snippets.py"), "--list", os.path.join(d, "page.md")])
        ident = listed.stdout.split()[0] if listed.stdout else "?"
        expect("docs_snippets.py lists the block as a program", listed.stdout.split()[1:2] == ["1"], listed.stdout)
        block = os.path.join(d, "doc_" + ident + ".cpp")
        r = run([sys.executable, os.path.join(HERE, "docs_snippets.py"), "--extract", ident,
                 os.path.join(d, "page.md"), block])
        text = open(block).read() if r.returncode == 0 else ""
        expect("the block's main ends with return 0, past the braces in literals and comments",
               text.rstrip().endswith("}\n  return 0;\n}"), text)
        r = run([sys.executable, os.path.join(HERE, "unity.py"), "--root", d, "--programs", unity, block])
        r = run([cxx, "-std=c++20", "-Wall", "-Werror=return-type", unity, "-o", prog]) if r.returncode == 0 else r
        expect("the block compiles as a function with a return", r.returncode == 0, r.stderr)
        if r.returncode == 0:
            expect("and runs", run([prog, "doc_" + ident]).returncode == 0)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
