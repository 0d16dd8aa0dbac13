"""A virtual environment for the benchmarks' peers (JAX, ...): stdlib only.

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from peers.venv import ensure_venv   # as peers.venv: a bare `import venv` is the stdlib's
    python = ensure_venv(os.path.join(ROOT, "build-bench", "peers-venv"), ["jax"])
    if python is None: ...         # the reason was printed; skip the peer

The venv is made once (python3 -m venv) and the packages pip-installed into it; a later call finds
them installed and returns at once (pip is asked again only for a package it cannot import).
The venv is made with `python3 -I -m venv` so that this file never shadows the stdlib's venv.
"""
import os
import subprocess
import sys

__all__ = ["ensure_venv", "last_error"]

last_error = None  # why the last ensure_venv returned None (the line it printed)


def _python(path):
    for rel in (("bin", "python3"), ("bin", "python"), ("Scripts", "python.exe")):
        p = os.path.join(path, *rel)
        if os.path.exists(p):
            return p
    return None


def _module(package):
    """The import name of a pip requirement: 'jax[cpu]==0.4.30' -> 'jax'."""
    name = package
    for sep in "[<>=!~; ":
        name = name.split(sep)[0]
    return name.replace("-", "_")


def _missing(python, packages):
    missing = []
    for p in packages:
        r = subprocess.run([python, "-c", f"import {_module(p)}"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        if r.returncode != 0:
            missing.append(p)
    return missing


def ensure_venv(path, packages, timeout=900):
    """The python of a venv at `path` with `packages` installed: creates the venv when absent and
    pip-installs what does not import yet. None (with the reason printed on stderr) when the venv
    cannot be made or pip fails (no network, no wheel, timeout of `timeout` seconds)."""
    def fail(why):
        global last_error
        last_error = why
        print(f"peers venv: {why}", file=sys.stderr, flush=True)
        return None

    path = os.path.abspath(path)
    python = _python(path)
    if python is None:
        try:
            r = subprocess.run([sys.executable, "-I", "-m", "venv", path], capture_output=True, text=True,
                               timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            return fail(f"python3 -m venv {path} failed: {e}")
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            return fail(f"python3 -m venv {path} failed: {last}")
        python = _python(path)
        if python is None:
            return fail(f"no python in the new venv {path}")
    missing = _missing(python, packages)
    if not missing:
        return python
    print(f"peers venv: pip install {' '.join(missing)} into {path} (once; up to {timeout} s)",
          file=sys.stderr, flush=True)
    cmd = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--timeout", "30", "--retries", "2"] + missing
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return fail(f"pip install {' '.join(missing)} timed out after {timeout} s")
    except OSError as e:
        return fail(f"pip could not run: {e}")
    if r.returncode != 0:
        lines = [l.strip() for l in r.stderr.splitlines() if l.strip()] or ["?"]
        errors = [l for l in lines if l.startswith("ERROR:")]
        return fail(f"pip install {' '.join(missing)} failed: {(errors or lines)[-1]}")
    still = _missing(python, missing)
    if still:
        return fail(f"installed but not importable: {' '.join(still)}")
    return python
