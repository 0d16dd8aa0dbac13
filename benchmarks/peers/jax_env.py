"""Environment of the JAX peers: N virtual CPU devices, set before jax is imported.

    from jax_env import force_cpu_devices   # the peers run as scripts from this folder
    force_cpu_devices(8)
    import jax
"""
import os

__all__ = ["force_cpu_devices"]


def force_cpu_devices(n):
    """XLA's CPU client with `n` virtual devices (--xla_force_host_platform_device_count), keeping
    the caller's other XLA flags; JAX on the CPU unless JAX_PLATFORMS says otherwise."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
