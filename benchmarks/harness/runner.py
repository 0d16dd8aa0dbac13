"""Running benchmark cases: building the executables, one subprocess per case with a progress bar,
failures kept to their section, and the records saved after every case (a crash or an interrupt
leaves what ran).

A case is one command that prints JSON records (one object per line starting with "{") on stdout,
or a Python callable returning records (the compile benchmark's compiler runs). Progress goes to
stderr: one bar line per case (case i of n, elapsed, estimated remaining; the estimate is from the
durations of the same cases in the previous run when there was one, kept in build-bench/).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build-bench")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}

# The benchmarks are built for this CPU (-march=native: Eigen's widest SIMD packets in the
# elementwise, softmax and norm kernels, as a user tuning for their machine builds them, and as
# XLA's JIT compiles for the host); SHARDLIB_BENCH_CPP_ARGS overrides ("" for the portable flags).
# (g++ 12's AVX-512 noise, GCC bug 105593, is silenced inside our headers: detail/attributes.hpp.)
CPP_ARGS = os.environ.get("SHARDLIB_BENCH_CPP_ARGS", "-march=native").split()


class BuildError(Exception):
    pass


def configure():
    """build-bench/ configured as the benchmarks' release build with CPP_ARGS."""
    want = "-Dcpp_args=" + " ".join(CPP_ARGS)
    if not os.path.exists(os.path.join(BUILD, "build.ninja")):
        r = subprocess.run(["meson", "setup", BUILD, ROOT, "--buildtype=release", "-Dtests=false", "-Dexamples=false",
                            want], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise BuildError(f"meson setup {BUILD} failed:\n{r.stderr[-3000:]}")
        return
    try:
        with open(os.path.join(BUILD, "meson-info", "intro-buildoptions.json")) as f:
            have = next((o["value"] for o in json.load(f) if o["name"] == "cpp_args"), None)
    except (OSError, ValueError):
        have = None
    if have != CPP_ARGS:
        subprocess.run(["meson", "configure", BUILD, want], check=True, stdout=subprocess.DEVNULL)


def build(target):
    """Path of benchmarks/TARGET in build-bench/, built (BuildError with the compiler's last words
    when it does not build)."""
    configure()
    # ninja itself, by output path: it regenerates the build first when a meson.build changed (then
    # `meson compile TARGET` would not know a new target yet).
    exe = os.path.join("benchmarks", target)
    print(f"  building {exe} in {BUILD} ...", file=sys.stderr, flush=True)
    r = subprocess.run(["ninja", "-C", BUILD, exe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise BuildError(f"ninja {exe} failed:\n" + "\n".join(r.stdout.splitlines()[-30:]))
    return os.path.join(BUILD, exe)


def has_mpi(exe):
    backends = subprocess.run([exe, "--backends"], capture_output=True, text=True, check=True).stdout.split()
    return "mpi" in backends and shutil.which("mpirun") is not None


def mpi_env():
    return dict(os.environ, **MPI_ENV)


_blas_kernels = {}


def blas_kernel(cmd, env=None):
    """The BLAS kernel of the shardlib benchmark executable that `cmd` runs (directly or under
    mpirun), asked of it with --blas-kernel; None when `cmd` runs no such executable."""
    exe = next((a for a in cmd if os.path.dirname(os.path.abspath(a)) == os.path.join(BUILD, "benchmarks")
                and os.access(a, os.X_OK)), None)
    if exe is None:
        return None
    if exe not in _blas_kernels:
        out = subprocess.run([exe, "--blas-kernel"], capture_output=True, text=True, env=env)
        _blas_kernels[exe] = out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
    return _blas_kernels[exe]


@dataclass
class Case:
    """One command of a benchmark (or `fn`, a callable returning records). `peer` names the peer a
    peer's case runs ("jax", "dtensor"): its failure is a note, not a failed section. `post` maps
    each record after the run; `timeout`: seconds before the case is stopped (900; None: no limit), a hang
    being a failure like a crash."""
    label: str
    bench: str = None
    argv: list = field(default_factory=list)
    env: dict = None
    peer: str = None
    post: object = None
    fn: object = None
    timeout: float = 900


class CaseFailed(Exception):
    """A case that failed: the message, the last lines of its output, the records it printed."""

    def __init__(self, message, tail="", records=()):
        super().__init__(message)
        self.tail = tail
        self.records = list(records)


class Progress:
    """The bar on stderr: case i of n, elapsed, estimated remaining."""

    def __init__(self, labels, history):
        self.labels = labels
        self.history = history  # label -> seconds in the previous run
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def estimate_left(self, i, durations):
        known = [durations[j] for j in range(i)]
        mean = sum(known) / len(known) if known else None
        left = 0.0
        for j in range(i, len(self.labels)):
            h = self.history.get(self.labels[j])
            if h is None:
                if mean is None:
                    return None
                h = mean
            left += h
        return left

    def show(self, i, durations):
        n = len(self.labels)
        el = time.perf_counter() - self.start
        left = self.estimate_left(i, durations)
        width = 24
        filled = width * i // max(n, 1)
        bar = "#" * filled + "." * (width - filled)
        left_text = f", about {fmt_time(left)} left" if left is not None else ""
        line = f"[{bar}] case {i + 1}/{n}, {fmt_time(el)} elapsed{left_text}: {self.labels[i]}"
        print(line, file=sys.stderr, flush=True)


def fmt_time(s):
    s = int(round(s))
    return f"{s // 60}:{s % 60:02d}"


def _parse(stdout):
    records = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                print(f"  (not a JSON record, skipped: {line[:120]})", file=sys.stderr)
    return records


def run_command(cmd, env=None, log=None, timeout=None):
    """Records of one command: its stdout's JSON lines, each with the BLAS kernel of the shardlib
    executable it ran. stderr goes to the terminal, or appended to `log` (a path) when given.
    CaseFailed (with stderr's last lines and the records printed before the failure) when it exits
    non-zero, cannot start, or runs past `timeout` seconds (then its whole process group is killed:
    mpirun's and torchrun's children too)."""
    if log is None:
        print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    else:
        with open(log, "a") as lf:
            print("$ " + " ".join(cmd), file=lf)
    lf = open(log, "a") if log else None
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=lf, text=True, env=env, start_new_session=True)
    except OSError as e:
        if lf:
            lf.close()
        raise CaseFailed(f"{cmd[0]} could not run: {e}")
    timed_out = False
    try:
        stdout, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        stdout, _ = p.communicate()
    except KeyboardInterrupt:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        raise
    finally:
        if lf:
            lf.close()
    tail = ""
    if log:
        with open(log, errors="replace") as f:
            tail = "\n".join(f.read().splitlines()[-15:])
    records = _parse(stdout)
    kernel = blas_kernel(cmd, env)
    for r in records:
        r.setdefault("blas_kernel", kernel)
    if timed_out or p.returncode != 0:
        if timed_out:
            why = f"stopped after {timeout} s"
        else:
            why = f"exit status {p.returncode}" if p.returncode > 0 else f"killed by signal {-p.returncode}"
        shown = " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))
        e = CaseFailed(f"`{shown}` failed ({why})" + (f"; its {len(records)} record(s) before that are kept" if records else ""),
                       tail)
        e.records = records
        raise e
    return records


def run_cases(cases, log=None, history=None, on_case=None):
    """Runs `cases` in order with the progress bar. Returns (records, notes, durations): durations are
    the seconds of each case, in order; a failing case
    of ours or a peer's adds a note (bench, text) and the others go on; each record gets its case's
    bench unless it names one. `on_case(records, notes)` is called after each case (the records are
    saved then). `log`: None (the cases' stderr on the terminal), or a dict from bench name to the
    file its cases' stderr is appended to. `history`: label -> seconds of the previous run."""
    progress = Progress([c.label for c in cases], history or {})
    records, notes, durations = [], [], []
    for i, c in enumerate(cases):
        progress.show(i, durations)
        t0 = time.perf_counter()
        try:
            got = c.fn() if c.fn is not None else run_command(c.argv, c.env, (log or {}).get(c.bench), c.timeout)
        except CaseFailed as e:
            got = e.records
            who = f"peer {c.peer}" if c.peer else "case"
            note = f"{who} \"{c.label}\" failed: {e}" + (f"; its last output:\n{e.tail}" if e.tail else "")
            notes.append((c.bench, note))
            print("  " + note.replace("\n", "\n    "), file=sys.stderr, flush=True)
        if c.post:
            got = [c.post(r) for r in got]
        for r in got:
            r.setdefault("bench", c.bench)
        records += got
        durations.append(time.perf_counter() - t0)
        if on_case:
            on_case(records, notes)
    if cases:
        print(f"  {len(cases)} case(s) in {fmt_time(time.perf_counter() - progress.start)}", file=sys.stderr, flush=True)
    return records, notes, durations
