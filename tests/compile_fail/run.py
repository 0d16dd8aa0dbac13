#!/usr/bin/env python3
"""Compile-fail tests: each snippet must compile as it is, and must fail to compile with
-DSHARDLIB_SHOULD_FAIL, with an error whose text contains every expected phrase.

A snippet states its phrases in comments:
    // expect: words every compiler must print
    // expect-gcc: words only g++ prints (e.g. the axis name inside a template argument)
    // expect-clang: words only clang prints
    // expect-errors: N            exactly N errors (each shardlib diagnostic once; -gcc/-clang: one compiler's)
    // expect-max-bytes: B         at most B bytes of compiler output

The compiler and its flags (include directories, defines) are those of a reference translation
unit of the build, read from compile_commands.json (tests/compile_flags.py). With g++, the
library's umbrella header is precompiled once and included first in every snippet (parsing it is
most of a snippet's compile time); the errors are the same. The snippets as they are (without
SHARDLIB_SHOULD_FAIL) are compiled together, in one translation unit (each alone when that fails).

usage: run.py --compiler-id ID --compile-commands FILE --reference SOURCE_NAME -- SNIPPET...
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from compile_flags import reference_flags  # noqa: E402
from unity import skeleton  # noqa: E402


def expectations(path, compiler_id):
    words = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\s*//\s*expect(?:-(\w+))?:\s*(.+?)\s*$", line)
            if m and (m.group(1) is None or m.group(1) == compiler_id):
                words.append(m.group(2))
    return words


# The lines a shardlib diagnostic prints besides the one that names it (detail/diagnostics.hpp's
# SHARDLIB_STATIC_REQUIRE: an incomplete error type, then the static_assert).
_HELPER_LINES = re.compile(r"invalid application of .sizeof. to incomplete type|non-constant condition for static assertion"
                           r"|static_assert expression is not an integral constant expression"
                           r"|static_assert failed due to requirement")


def count_errors(stderr):
    """The errors a user reads: each shardlib diagnostic once (g++: its 'static assertion failed';
    clang: its undefined 'shardlib::error::' template), and every other error line."""
    n = 0
    for line in stderr.splitlines():
        if ": error: " not in line or _HELPER_LINES.search(line):
            continue
        n += 1
    return n


def limits(path, compiler_id):
    """The snippet's '// expect-errors[-compiler]: N' and '// expect-max-bytes: B' (None when absent)."""
    errors = max_bytes = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\s*//\s*expect-errors(?:-(\w+))?:\s*(\d+)\s*$", line)
            if m and (m.group(1) is None or m.group(1) == compiler_id):
                errors = int(m.group(2))
            m = re.match(r"\s*//\s*expect-max-bytes:\s*(\d+)\s*$", line)
            if m:
                max_bytes = int(m.group(1))
    return errors, max_bytes


def compile_snippet(compiler, cwd, flags, path, should_fail):
    cmd = compiler + flags + ["-fsyntax-only", path]
    if should_fail:
        cmd.insert(len(compiler), "-DSHARDLIB_SHOULD_FAIL")
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)


def all_compile(compiler, cwd, flags, snippets, tmp):
    """Whether every snippet compiles without SHARDLIB_SHOULD_FAIL, tried in one translation unit
    (each snippet in a namespace of its own, as tests/unity.py does): one compilation instead of
    one per snippet. When it fails, each snippet is compiled alone to say which."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lines = []
    for p in snippets:
        lines += skeleton(p, root)
    for i, p in enumerate(snippets):
        lines += [f"namespace compile_fail_{i} {{", f'#include "{p}"', "}"]
    unity = os.path.join(tmp, "all_snippets.cpp")
    with open(unity, "w") as f:
        f.write("\n".join(lines) + "\n")
    return compile_snippet(compiler, cwd, flags, unity, should_fail=False).returncode == 0


def check(compiler, cwd, flags, compiler_id, path, known_good):
    name = os.path.basename(path)
    words = expectations(path, compiler_id)
    if not words:
        return False, f"{name}: states no '// expect:' phrase"
    if not known_good:
        good = compile_snippet(compiler, cwd, flags, path, should_fail=False)
        if good.returncode != 0:
            return False, f"{name}: does not compile even without SHARDLIB_SHOULD_FAIL:\n{good.stderr[-3000:]}"
    bad = compile_snippet(compiler, cwd, flags, path, should_fail=True)
    if bad.returncode == 0:
        return False, f"{name}: compiled with SHARDLIB_SHOULD_FAIL, but must not"
    missing = [w for w in words if w not in bad.stderr]
    if missing:
        return False, f"{name}: the error lacks {missing}; the compiler said:\n{bad.stderr[-4000:]}"
    errors, max_bytes = limits(path, compiler_id)
    got = count_errors(bad.stderr)
    if errors is not None and got != errors:
        return False, f"{name}: {got} errors where {errors} were expected (one per mistake); the compiler said:\n{bad.stderr[-6000:]}"
    if max_bytes is not None and len(bad.stderr) > max_bytes:
        return False, f"{name}: {len(bad.stderr)} bytes of errors, more than {max_bytes}:\n{bad.stderr[-3000:]}"
    counted = "" if errors is None else f", {got} error(s)"
    sized = "" if max_bytes is None else f", {len(bad.stderr)} bytes"
    return True, f"{name}: fails to compile, naming {words}{counted}{sized}"


def main():
    argv = sys.argv[1:]
    sep = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--compiler-id", required=True)
    parser.add_argument("--compile-commands", required=True)
    parser.add_argument("--reference", required=True, help="the source whose flags the snippets get")
    opts = parser.parse_args(argv[:sep])
    snippets = [os.path.abspath(p) for p in argv[sep + 1:]]
    if not snippets:
        print("no snippets given")
        return 1
    cwd, compiler, flags = reference_flags(opts.compile_commands, opts.reference)
    print("flags of " + opts.reference + ": " + " ".join(compiler + flags))
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        flags = flags + precompiled_umbrella(compiler, cwd, flags, opts.compiler_id, tmp)
        known_good = all_compile(compiler, cwd, flags, snippets, tmp)
        print("without SHARDLIB_SHOULD_FAIL: " + ("all compile (one translation unit)" if known_good else
                                                  "not all compile together; each is compiled alone"))
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            for ok, message in pool.map(lambda p: check(compiler, cwd, flags, opts.compiler_id, p, known_good), snippets):
                print(("PASS " if ok else "FAIL ") + message)
                failed += not ok
    print(f"{len(snippets) - failed} passed, {failed} failed")
    return 1 if failed else 0


def precompiled_umbrella(compiler, cwd, flags, compiler_id, tmp):
    """Flags that include <shardlib/shardlib.hpp> precompiled (g++ only; none when it fails)."""
    if compiler_id != "gcc":
        return []
    header = os.path.join(tmp, "umbrella.hpp")
    with open(header, "w") as f:
        f.write("#include <shardlib/shardlib.hpp>\n")
    r = subprocess.run(compiler + flags + ["-x", "c++-header", header, "-o", header + ".gch"],
                       capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        print("note: the umbrella header did not precompile; compiling each snippet in full:\n" + r.stderr[-2000:])
        return []
    return ["-include", header]


if __name__ == "__main__":
    sys.exit(main())
