#!/usr/bin/env python3
"""Compile-fail tests: each snippet must compile as it is, and must fail to compile with
-DSHARDLIB_SHOULD_FAIL, with an error whose text contains every expected phrase.

A snippet states its phrases in comments:
    // expect: words every compiler must print
    // expect-gcc: words only g++ prints (e.g. the axis name inside a template argument)
    // expect-clang: words only clang prints

usage: run.py --compiler-id ID --include DIR -- CXX [ARGS...] -- SNIPPET...
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys


def expectations(path, compiler_id):
    words = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\s*//\s*expect(?:-(\w+))?:\s*(.+?)\s*$", line)
            if m and (m.group(1) is None or m.group(1) == compiler_id):
                words.append(m.group(2))
    return words


def compile_snippet(cxx, include, path, should_fail, flags=()):
    cmd = cxx + ["-std=c++20", "-fsyntax-only", "-I" + include, *flags, path]
    if should_fail:
        cmd.insert(len(cxx), "-DSHARDLIB_SHOULD_FAIL")
    return subprocess.run(cmd, capture_output=True, text=True)


def check(cxx, include, compiler_id, path, flags=()):
    name = os.path.basename(path)
    words = expectations(path, compiler_id)
    if not words:
        return False, f"{name}: states no '// expect:' phrase"
    good = compile_snippet(cxx, include, path, should_fail=False, flags=flags)
    if good.returncode != 0:
        return False, f"{name}: does not compile even without SHARDLIB_SHOULD_FAIL:\n{good.stderr[-3000:]}"
    bad = compile_snippet(cxx, include, path, should_fail=True, flags=flags)
    if bad.returncode == 0:
        return False, f"{name}: compiled with SHARDLIB_SHOULD_FAIL, but must not"
    missing = [w for w in words if w not in bad.stderr]
    if missing:
        return False, f"{name}: the error lacks {missing}; the compiler said:\n{bad.stderr[-4000:]}"
    return True, f"{name}: fails to compile, naming {words}"


def main():
    argv = sys.argv[1:]
    first = argv.index("--")
    second = argv.index("--", first + 1)
    parser = argparse.ArgumentParser()
    parser.add_argument("--compiler-id", required=True)
    parser.add_argument("--include", required=True)
    parser.add_argument("--flag", action="append", default=[], help="an extra compiler flag (e.g. Kokkos' include directory)")
    opts = parser.parse_args(argv[:first])
    cxx, snippets = argv[first + 1:second], argv[second + 1:]
    if not snippets:
        print("no snippets given")
        return 1
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for ok, message in pool.map(lambda p: check(cxx, opts.include, opts.compiler_id, p, opts.flag), snippets):
            print(("PASS " if ok else "FAIL ") + message)
            failed += not ok
    print(f"{len(snippets) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
