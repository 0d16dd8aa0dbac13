"""Environment of the JAX peers: N virtual CPU devices, set before jax is imported; and what the
peers share once it is (a mesh, the timer).

    from jax_env import force_cpu_devices   # the peers run as scripts from this folder
    force_cpu_devices(8)
    import jax
"""
import math
import os
import statistics
import time

__all__ = ["force_cpu_devices", "make_mesh", "time_calls"]


def force_cpu_devices(n):
    """XLA's CPU client with `n` virtual devices (--xla_force_host_platform_device_count), keeping
    the caller's other XLA flags; JAX on the CPU unless JAX_PLATFORMS says otherwise."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def make_mesh(shape, names):
    """A Mesh of the first prod(shape) devices with axis `names`, with the classic (GSPMD, "auto")
    axis types where the jax version has axis types: shardings by in/out specs and constraints."""
    import jax
    import numpy as np
    from jax.sharding import Mesh
    devs = np.array(jax.devices()[:math.prod(shape)]).reshape(shape)
    try:
        from jax.sharding import AxisType
        return Mesh(devs, names, axis_types=(AxisType.Auto,) * len(names))
    except (ImportError, TypeError):
        return Mesh(devs, names)


def time_calls(f, args, reps, warmup=2, min_seconds=0.05, sync_each=False):
    """Median seconds per call of f(*args) over `reps` repetitions of as many calls as take
    ~min_seconds, each repetition ended by block_until_ready. `sync_each`: wait for every call
    (XLA's CPU collectives can deadlock with many executions in flight: seen as an all-to-all
    rendezvous that 7 of 8 devices reach, then an abort after 40 s)."""
    import jax
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    one = time.perf_counter() - t0
    iters = max(1, min(20000, int(min_seconds / max(one, 1e-9))))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = f(*args)
            if sync_each:
                jax.block_until_ready(out)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)
