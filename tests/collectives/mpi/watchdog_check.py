#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs watchdog.cpp's program under mpirun -np 2 and checks the mpi backend's watchdog: a
collective that a rank never reaches ends the job within seconds, with the call, group and rank
on stderr (SHARDLIB_MPI_TIMEOUT=5); a timeout that is not a number is refused by name.

usage: watchdog_check.py MPIRUN PROGRAM"""
import os
import subprocess
import sys
import time

mpirun, program = sys.argv[1], sys.argv[2]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
failures = []


def run(timeout_value):
    start = time.monotonic()
    p = subprocess.run([mpirun, "-np", "2", "--oversubscribe", program], env=dict(env, SHARDLIB_MPI_TIMEOUT=timeout_value),
                       capture_output=True, text=True, timeout=120)
    return p, time.monotonic() - start


p, seconds = run("5")
out = p.stdout + p.stderr
print(out)
print(f"exit status {p.returncode} after {seconds:.1f} s")
if p.returncode == 0:
    failures.append("the job ended with status 0")
if "rank 0: the first barrier passed" not in out:
    failures.append("the first barrier (rank 0 a second late, under the timeout) did not pass")
if "barrier on world (rank 1 of 2) has waited" not in out or "SHARDLIB_MPI_TIMEOUT=5" not in out:
    failures.append("no watchdog report naming rank 1's barrier")
if "rank 0 of 2" in out:
    failures.append("rank 0, sleeping outside any collective, was reported")
if seconds > 45:
    failures.append(f"the job took {seconds:.0f} s: it waited for rank 0's sleep of 60 s")

p, _ = run("soon")
print(p.stdout + p.stderr)
if p.returncode == 0 or 'SHARDLIB_MPI_TIMEOUT="soon" is not a number of seconds' not in p.stdout:
    failures.append("SHARDLIB_MPI_TIMEOUT=soon was not refused by name")

for f in failures:
    print("FAILED:", f)
sys.exit(1 if failures else 0)
