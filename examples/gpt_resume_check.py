#!/usr/bin/env python3
"""The gpt example's checkpoints: a run saved after 6 steps with one recipe on one mesh, resumed
with other recipes on other meshes (pipelined ones too, and saved by one), continues the loss
curve of the run that never stopped (each step's loss within 1e-4, relative, in float32; 1e-3 in
f16, whose loss scaler's state is saved), and a resume into a model of another shape fails
naming the tensor and both shapes.

usage: gpt_resume_check.py GPT_EXECUTABLE WORK_DIR
"""
import os
import re
import shutil
import subprocess
import sys

MODEL = ["--dim", "32", "--ff", "64", "--seq", "16", "--batch", "8", "--log-every", "1"]
STEP = re.compile(r"^step\s+(\d+)/\d+\s+loss\s+([0-9.]+)", re.M)


def run(gpt, *args, fail=False):
    r = subprocess.run([gpt, *args, *MODEL], capture_output=True, text=True)
    if (r.returncode != 0) != fail:
        print(f"{'succeeded' if fail else 'failed'} (status {r.returncode}): {' '.join(args)}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
        sys.exit(1)
    return r


def losses(out):
    return {int(s): float(l) for s, l in STEP.findall(out)}


def main():
    gpt, work = sys.argv[1], sys.argv[2]
    ckpt = os.path.join(work, "gpt_resume_ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)
    straight = losses(run(gpt, "--recipe", "dp", "--devices", "4", "--steps", "12").stdout)
    saved = losses(run(gpt, "--recipe", "dp", "--devices", "4", "--steps", "6", "--save", ckpt, "--every", "3").stdout)
    assert sorted(saved) == list(range(6)), saved
    failed = 0

    def resumed(saved_as, ckpt, recipe, devices, want, tol, *extra):
        nonlocal failed
        out = run(gpt, "--recipe", recipe, "--devices", devices, "--steps", "12", "--resume", ckpt, *extra).stdout
        got = losses(out)
        if sorted(got) != list(range(6, 12)) or "resumed from" not in out:
            print(f"FAIL {recipe} on {devices}: resumed steps {sorted(got)}\n{out[-2000:]}")
            failed += 1
            return
        worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in got)
        ok = worst <= tol
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {saved_as} saved after 6 steps, {recipe} on {devices} {' '.join(extra)} resumed: "
              f"steps 6-11 within {worst:.2e} of the run that never stopped")

    for recipe, devices in [("zero3", "2"), ("dp_tp", "8"), ("tp", "4"), ("pp_tp", "8"), ("pp", "2")]:
        resumed("dp on 4 devices", ckpt, recipe, devices, straight, 1e-4)
    # Saved by a pipelined run (each stage lists its own tensors), resumed with and without stages.
    pp_ckpt = os.path.join(work, "gpt_resume_ckpt_pp")
    shutil.rmtree(pp_ckpt, ignore_errors=True)
    run(gpt, "--recipe", "pp_zero1", "--devices", "4", "--steps", "6", "--save", pp_ckpt)
    for recipe, devices in [("dp", "2"), ("pp", "2"), ("pp_dp", "8")]:
        resumed("pp_zero1 on 4 devices (2 stages)", pp_ckpt, recipe, devices, straight, 1e-4)
    # f16: the loss scaler's state goes with the run (the same skipped steps and scale after it).
    f16_ckpt = os.path.join(work, "gpt_resume_ckpt_f16")
    shutil.rmtree(f16_ckpt, ignore_errors=True)
    f16 = ["--precision", "f16"]
    straight16 = losses(run(gpt, "--recipe", "dp", "--devices", "2", "--steps", "12", *f16).stdout)
    run(gpt, "--recipe", "pp_dp", "--devices", "4", "--steps", "6", "--save", f16_ckpt, *f16)
    for recipe, devices in [("dp", "4"), ("pp_zero2", "4")]:
        resumed("f16 pp_dp on 4 devices", f16_ckpt, recipe, devices, straight16, 1e-3, *f16)
    # Another model shape: refused, naming the tensor and both shapes; a missing checkpoint: named.
    for args, words in [(["--resume", ckpt, "--dim", "64"], ["'model/wte'", "[256, 32]", "[256, 64]"]),
                        (["--resume", os.path.join(work, "no-such-dir")], ["cannot open", "no-such-dir"])]:
        cmd = [gpt, "--recipe", "dp", "--devices", "2", "--steps", "12", "--ff", "64", "--seq", "16", "--batch", "8"] + args
        if "--dim" not in args:
            cmd += ["--dim", "32"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        line = next((l for l in r.stderr.splitlines() if l.startswith("gpt: ")), "")
        ok = r.returncode != 0 and all(w in line for w in words) and not STEP.search(r.stdout)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} refused: {line or r.stderr[-1000:]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
