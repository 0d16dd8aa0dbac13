"""The compiler flags of a reference translation unit of this build, read from Meson's
compile_commands.json: include directories, defines and language flags exactly as Meson resolved
them from the dependencies (Kokkos, Eigen, MPI, OpenBLAS), whatever Kokkos exports. The test
scripts that run a compiler themselves (compile_fail/run.py, nvcc_compile.py) use them, so that a
user's Kokkos works as Debian's does.
"""
import json
import os
import shlex

# Flags that say what to produce, not how to read the source: dropped.
_OUTPUT_WITH_ARG = {"-o", "-MQ", "-MF", "-MT"}
_OUTPUT = {"-c", "-MD", "-MMD", "-fdiagnostics-color=always"}


def reference_command(compile_commands, source_name):
    """(directory, argv) of the entry whose source file is named `source_name`."""
    with open(compile_commands) as f:
        entries = json.load(f)
    for e in entries:
        if os.path.basename(e["file"]) == source_name:
            return e["directory"], shlex.split(e["command"]) if "command" in e else e["arguments"]
    raise SystemExit(f"{compile_commands} has no entry for {source_name}")


def reference_flags(compile_commands, source_name):
    """(directory, compiler argv, flags): the entry's compiler (without ccache) and its flags without
    the source, the output options, optimisation and debug levels. Relative paths in the flags are
    relative to `directory` (run the compiler there)."""
    directory, argv = reference_command(compile_commands, source_name)
    while argv and os.path.basename(argv[0]) in ("ccache", "sccache"):
        argv = argv[1:]
    compiler, flags, skip = [argv[0]], [], False
    for a in argv[1:]:
        if skip:
            skip = False
            continue
        if a in _OUTPUT_WITH_ARG:
            skip = True
            continue
        if a in _OUTPUT or a.startswith(("-O", "-g")) or os.path.basename(a) == source_name:
            continue
        flags.append(a)
    return directory, compiler, flags


def include_and_define_flags(flags):
    """Only the -I, -isystem and -D flags, for a compiler that takes no others of the host
    compiler's (nvcc); also whether the host compiler gets OpenMP (-fopenmp) and threads (-pthread)."""
    out, host, it = [], [], iter(flags)
    for a in it:
        if a in ("-I", "-D"):
            out.append(a + next(it))
        elif a == "-isystem":
            out += ["-isystem", next(it)]
        elif a.startswith("-isystem"):
            out += ["-isystem", a[len("-isystem"):]]
        elif a.startswith(("-I", "-D")):
            out.append(a)
        elif a in ("-fopenmp", "-pthread"):
            host.append(a)
    return out, host
