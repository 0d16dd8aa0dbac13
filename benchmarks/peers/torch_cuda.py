"""What the PyTorch peers on a GPU share (torch_gpu.py, block_torch.py): torch and the GPU, or exit
status 3 saying why not; and the timer bench_gpu's records are measured with (calls queued back to
back for about `target` seconds, torch.cuda.synchronize() after them, the median of `reps`)."""
import statistics
import sys
import time


def cuda_torch(script):
    """(torch, torch.nn.functional, the device, the GPU's name); exits with status 3 naming `script`
    when torch cannot be imported or sees no GPU."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"{script}: torch cannot be imported ({e})", file=sys.stderr)
        sys.exit(3)
    if not torch.cuda.is_available():
        print(f"{script}: torch sees no GPU", file=sys.stderr)
        sys.exit(3)
    return torch, F, torch.device("cuda"), torch.cuda.get_device_name(0)


def seconds_per_call(torch, fn, reps=7, target=0.02, warmups=1, max_iters=2000, min_iters=1):
    """Median seconds per call of `fn` (see the module comment), after `warmups` calls."""
    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = time.perf_counter() - t0
    iters = max(min_iters, min(max_iters, int(target / max(one, 1e-7))))
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)
