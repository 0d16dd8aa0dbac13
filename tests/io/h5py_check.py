#!/usr/bin/env python3
"""A checkpoint written by shardlib, read by h5py: ordinary arrays, in their global shapes and
types, with the mesh, spec and version attributes.

usage: h5py_check.py CHECKPOINT_EXAMPLE [ARGS...]
Runs the example (examples/checkpoint.cpp) with --dir in a fresh directory, then opens the
file it wrote. Exits 77 (skipped) when h5py cannot be imported.
"""
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"skipped: {e} (Debian's python3-h5py, or pip install h5py)")
    sys.exit(77)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(sys.argv[1:] + ["--dir", tmp], check=True)
        path = os.path.join(tmp, "model.h5")
        with h5py.File(path, "r") as f:
            assert int(f.attrs["shardlib_format"][0]) == 1, dict(f.attrs)
            assert f.attrs["shardlib_version"].decode().count(".") == 2
            names = []
            f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
            assert sorted(names) == ["embedding", "mlp/w1", "mlp/w2", "step"], names
            expected = {
                "mlp/w1": np.arange(64 * 256, dtype=np.float32).reshape(64, 256),
                "mlp/w2": np.arange(256 * 64, dtype=np.float32).reshape(256, 64),
                "embedding": np.arange(1000 * 32, dtype=np.float64).reshape(1000, 32),
                "step": np.array([100], dtype=np.int64),
            }
            for name, want in expected.items():
                got = f[name][()]
                assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
                assert got.shape == want.shape, (name, got.shape, want.shape)
                assert np.array_equal(got, want), name
            w1 = f["mlp/w1"]
            assert w1.attrs["shardlib_spec"].decode() == 'Spec<none, "model">', dict(w1.attrs)
            assert w1.attrs["shardlib_dtype"].decode() == "f32"
            assert w1.attrs["shardlib_mesh"].decode().startswith("{data: ")
            assert len(w1.attrs["shardlib_checksums"]) == len(w1.attrs["shardlib_blocks"]) // 4
            print(f"h5py {h5py.__version__} read {sorted(names)} from {path}: values, types and attributes as saved")


if __name__ == "__main__":
    main()
