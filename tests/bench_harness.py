#!/usr/bin/env python3
"""Tests of benchmarks/run's harness (benchmarks/harness/): names, the report folder, failing cases
and peers, the progress estimate, the goals table and the report without matplotlib. Nothing is
built and no benchmark runs: the cases are small Python commands.

usage: bench_harness.py  (unittest; exit status 0 when all pass)
"""
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from contextlib import redirect_stderr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from harness import goals, report  # noqa: E402
from harness.runner import Case, Progress, run_cases  # noqa: E402

RUN = os.path.join(ROOT, "benchmarks", "run")


def read(path):
    with open(path) as f:
        return f.read()


def py(code):
    return [sys.executable, "-c", code]


def record(**kw):
    r = {"bench": "x", "part": "p", "name": "n", "backend": "threads", "devices": 1, "seconds": 1.0,
         "baseline": None, "baseline_seconds": None}
    r.update(kw)
    return r


class Names(unittest.TestCase):
    def test_unknown_name_lists_the_benchmarks(self):
        r = subprocess.run([sys.executable, RUN, "colectives"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown benchmark 'colectives'", r.stderr)
        for name in ("collectives", "reshard", "ops", "grad", "io", "loops", "stencil", "train", "compile", "all"):
            self.assertIn(name, r.stderr)

    def test_report_is_given_alone(self):
        r = subprocess.run([sys.executable, RUN, "report", "ops"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("give it alone", r.stderr)

    def test_unwritable_report_folder_is_said_before_anything_runs(self):
        with tempfile.NamedTemporaryFile() as f:  # a file where the folder should be (root ignores modes)
            r = subprocess.run([sys.executable, RUN, "loops", "--report", os.path.join(f.name, "report")],
                               capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot write the report to", r.stderr)
        self.assertIn("--report DIR", r.stderr)
        self.assertNotIn("building", r.stderr)

    def test_report_without_records(self):
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([sys.executable, RUN, "report", "--report", d], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no records", r.stderr)


class Cases(unittest.TestCase):
    def run_quiet(self, cases, **kw):
        with redirect_stderr(io.StringIO()) as err:
            out = run_cases(cases, **kw)
        return out + (err.getvalue(),)

    def test_a_crashing_case_is_a_note_and_the_others_go_on(self):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "x.log")
            cases = [Case("good 1", "x", py('print(\'{"name": "a", "seconds": 1}\')')),
                     Case("crash", "x", py('import sys; print(\'{"name": "half"}\'); sys.stderr.write("boom\\n"); '
                                           'sys.exit(7)')),
                     Case("good 2", "y", py('print(\'{"name": "b", "seconds": 2}\')'))]
            records, notes, durations, err = self.run_quiet(cases, log={"x": log, "y": log})
            self.assertEqual([r["name"] for r in records], ["a", "half", "b"])  # what the crashed case printed is kept
            self.assertEqual([r["bench"] for r in records], ["x", "x", "y"])
            self.assertEqual(len(notes), 1)
            self.assertEqual(notes[0][0], "x")
            self.assertIn('case "crash" failed', notes[0][1])
            self.assertIn("exit status 7", notes[0][1])
            self.assertIn("its 1 record(s) before that are kept", notes[0][1])
            self.assertIn("boom", notes[0][1])  # the tail of its log
            self.assertEqual(len(durations), 3)
            self.assertIn("case 3/3", err)

    def test_a_failing_peer_is_a_peer_note(self):
        cases = [Case("jax thing", "x", py("import sys; sys.exit(3)"), peer="jax")]
        records, notes, _, _ = self.run_quiet(cases)
        self.assertEqual(records, [])
        self.assertTrue(notes[0][1].startswith('peer jax "jax thing" failed'))

    def test_a_case_that_hangs_is_stopped_with_its_children(self):
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "child-alive")
            child = os.path.join(d, "child.py")  # would write the marker after 3 s
            with open(child, "w") as f:
                f.write(f"import time\ntime.sleep(3)\nopen({marker!r}, 'w').close()\n")
            # the case prints a record, starts the child and hangs; both are killed at 1 s
            code = (f"import subprocess, sys, time; print('{{\"v\": 1}}', flush=True); "
                    f"subprocess.Popen([sys.executable, {child!r}]); time.sleep(60)")
            t0 = time.perf_counter()
            records, notes, _, _ = self.run_quiet([Case("hang", "x", py(code), timeout=1),
                                                   Case("next", "x", py('print(\'{"v": 2}\')'))])
            self.assertLess(time.perf_counter() - t0, 30)
            self.assertIn("stopped after 1 s", notes[0][1])
            self.assertEqual([r["v"] for r in records], [1, 2])
            time.sleep(3.5)
            self.assertFalse(os.path.exists(marker))

    def test_a_command_that_cannot_start(self):
        records, notes, _, _ = self.run_quiet([Case("missing", "x", ["/nonexistent/bench"])])
        self.assertIn("could not run", notes[0][1])

    def test_records_are_saved_after_every_case(self):
        seen = []
        self.run_quiet([Case("a", "x", py('print(\'{"v": 1}\')')), Case("b", "x", py('print(\'{"v": 2}\')'))],
                       on_case=lambda recs, notes: seen.append(len(recs)))
        self.assertEqual(seen, [1, 2])

    def test_post_maps_records(self):
        records, _, _, _ = self.run_quiet([Case("a", "x", py('print(\'{"v": 1}\')'), post=lambda r: dict(r, w=2))])
        self.assertEqual(records[0]["w"], 2)


class ProgressEstimate(unittest.TestCase):
    def test_from_the_previous_run_then_the_mean(self):
        p = Progress(["a", "b", "c"], {"b": 10.0, "c": 20.0})
        self.assertEqual(p.estimate_left(1, [4.0]), 30.0)
        p = Progress(["a", "b", "c"], {})
        self.assertIsNone(p.estimate_left(0, []))
        self.assertEqual(p.estimate_left(1, [4.0]), 8.0)


class Goals(unittest.TestCase):
    def rows(self, by_bench):
        return {r[1]: r for r in goals.evaluate(by_bench)}

    def test_pass_short_and_not_measured(self):
        ov = [record(bench="ops", part="overhead", name="add", overhead_us=0.4),
              record(bench="ops", part="overhead", name="gelu", overhead_us=1.6)]
        rows = self.rows({"ops": ov})
        row = rows["host overhead per op above the local kernel (1 device, 32x32)"]
        self.assertEqual(row[4], "short")
        self.assertIn("worst 1.600 us (gelu)", row[3])
        ov[1]["overhead_us"] = 0.9
        self.assertEqual(self.rows({"ops": ov})["host overhead per op above the local kernel (1 device, 32x32)"][4],
                         "pass")
        self.assertEqual(rows["tape overhead per recorded op"][4], "not measured")

    def test_faster_than_a_peer_matches_name_and_devices(self):
        recs = [record(bench="ops", part="mlp", name="mlp block", devices=1, seconds=1.0),
                record(bench="ops", part="mlp", name="mlp block", devices=8, seconds=1.0),
                record(bench="ops", part="mlp", name="mlp block", devices=1, seconds=1.5, backend="jax-cpu"),
                record(bench="ops", part="mlp", name="mlp block", devices=8, seconds=0.8, backend="jax-cpu")]
        row = self.rows({"ops": recs})["MLP block beside JAX (same devices)"]
        self.assertEqual(row[4], "short")
        self.assertIn("0.80x (8)", row[3])
        self.assertEqual(self.rows({"ops": recs})["MLP block beside DTensor (same devices)"][4], "not measured")

    def test_pipeline_recipes_beside_jaxs_best_and_the_bubbles_beside_their_ideal(self):
        tr = [record(bench="train", part="recipe", name="pp_dp", devices=8, tokens_per_second=12000.0),
              record(bench="train", part="recipe", name="dp", devices=8, tokens_per_second=13000.0),
              record(bench="train", part="recipe", name="dp", devices=8, tokens_per_second=8000.0, backend="jax-cpu"),
              record(bench="train", part="recipe", name="zero3", devices=8, tokens_per_second=9500.0, backend="jax-cpu"),
              record(bench="train", part="bubble", name="1f1b", devices=4, stages=4, bubble=0.29, bubble_ideal=0.2727,
                     microbatches=8, activation_peak_bytes=2200, activation_held_bytes=2000),
              record(bench="train", part="bubble", name="gpipe", devices=4, stages=4, bubble=0.28, bubble_ideal=0.2727,
                     microbatches=8, activation_peak_bytes=4000, activation_held_bytes=4000),
              record(bench="train", part="bubble", name="interleaved", devices=4, stages=4, bubble=0.20,
                     bubble_ideal=0.1579)]
        rows = self.rows({"train": tr})
        pp = rows["tokens/s of each pipeline recipe over JAX's best strategy on as many devices"]
        self.assertEqual(pp[4], "pass")
        self.assertIn("1.26x (pp_dp 8 dev)", pp[3])  # against JAX's zero3, its best, not its dp
        bubble = rows["pipeline bubble over its ideal (every device a stage)"]
        self.assertEqual(bubble[4], "short")
        self.assertIn("worst 1.267 (interleaved 4 stages)", bubble[3])
        peak = rows["1F1B's activation peak per stage over GPipe's, over p/m"]
        self.assertEqual(peak[4], "short")  # 2200 / 4000 = 0.55, over p/m = 0.5 by 1.1
        self.assertIn("1.100 (4 stages, m 8)", peak[3])
        held = rows["1F1B's activations held per stage (at the ends of ops) over GPipe's, over p/m"]
        self.assertEqual(held[4], "pass")  # 2000 / 4000 = p/m exactly
        self.assertIn("1.000 (4 stages, m 8)", held[3])
        # The bubble records take no part in the JAX comparison of the recipes.
        self.assertIn("(dp 8)", rows["tokens/s of each recipe beside JAX (same model, strategy, devices)"][3])


class Gpu(unittest.TestCase):
    """benchmarks/run gpu: skipped with the reason where there is no GPU or no CUDA Kokkos; a
    --kokkos folder that is not a CUDA Kokkos is a failed section naming what is missing."""

    def run_gpu(self, *extra, env=None):
        with tempfile.TemporaryDirectory() as d:
            e = {k: v for k, v in os.environ.items() if k != "SHARDLIB_KOKKOS_CUDA"}
            e.update(PATH="/usr/bin:/bin", **(env or {}))  # no nvidia-smi
            r = subprocess.run([sys.executable, RUN, "gpu", "--report", d] + list(extra), capture_output=True,
                               text=True, env=e)
            return r, json.loads(read(os.path.join(d, "records.json")))

    def test_no_gpu_and_no_kokkos_is_skipped_with_both_reasons(self):
        r, saved = self.run_gpu()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("== gpu (skipped)", r.stdout)
        self.assertIn("nvidia-smi is not on the PATH", r.stdout)
        self.assertIn("--kokkos DIR", r.stdout)
        self.assertEqual(saved["sections"]["gpu"]["status"], "skipped")

    def test_a_folder_that_is_not_a_cuda_kokkos_fails_naming_it(self):
        with tempfile.TemporaryDirectory() as k:
            os.makedirs(os.path.join(k, "bin"))
            os.makedirs(os.path.join(k, "include"))
            open(os.path.join(k, "bin", "nvcc_wrapper"), "w").close()
            with open(os.path.join(k, "include", "KokkosCore_config.h"), "w") as f:
                f.write("#define KOKKOS_ENABLE_SERIAL\n")
            r, saved = self.run_gpu("--kokkos", k)
            self.assertEqual(r.returncode, 1)
            self.assertIn("was built without CUDA", r.stdout)
            self.assertEqual(saved["sections"]["gpu"]["status"], "failed")
            r, _ = self.run_gpu(env={"SHARDLIB_KOKKOS_CUDA": os.path.join(k, "nowhere")})
            self.assertEqual(r.returncode, 1)
            self.assertIn("is not a Kokkos install with CUDA", r.stdout)

    def test_goals_take_gpu_records_only(self):
        recs = [record(bench="gpu", part="overhead", name="a + b", overhead_us=3.0, gpu="NVIDIA H200"),
                record(bench="gpu", part="overhead", name="gelu", overhead_us=9.0, gpu="none (host memory)")]
        row = [r for r in goals.evaluate({"gpu": recs}) if r[1].startswith("host overhead per op above its bare launch")][0]
        self.assertEqual(row[4], "pass")
        self.assertIn("3.00 us", row[3])


class Report(unittest.TestCase):
    def test_sections_merge_and_the_report_renders_without_plots(self):
        with tempfile.TemporaryDirectory() as d:
            saved = report.load(d)
            self.assertEqual(saved["sections"], {})
            loops = [record(bench="loops", part="for", name="add", seconds=0.002, baseline="hand loop",
                            baseline_seconds=0.002, ratio_to_baseline=1.0, GBps=30.0, baseline_GBps=30.0, copy_GBps=29.0,
                            fraction_of_copy=1.03)]
            report.save(d, saved, {"loops": {"status": "ok", "notes": [], "records": loops}})
            report.save(d, report.load(d), {"io": {"status": "failed", "notes": ["io was not run: no HDF5"],
                                                   "records": []}})
            saved = report.load(d)
            self.assertEqual(set(saved["sections"]), {"loops", "io"})  # the second run kept the first's section
            with redirect_stderr(io.StringIO()):
                report.render(d, saved, "matplotlib is not installed")
            md = read(os.path.join(d, "report.md"))
            self.assertIn("**No plots**: matplotlib is not installed.", md)
            self.assertIn("| loops | parallel_for / parallel_reduce speed of the hand-written loop | >= 0.95 |", md)
            self.assertIn("io was not run: no HDF5", md)
            self.assertIn("| CPU |", md)
            html = read(os.path.join(d, "report.html"))
            self.assertIn("<table>", html)
            self.assertIn("class='pass'", html)
            json.loads(read(os.path.join(d, "records.json")))

    def test_train_renders_its_recipes_and_the_pipeline_bubbles(self):
        # The bubble records (part "bubble") have no losses: the train tables once crashed on them.
        recipe = record(bench="train", part="recipe", name="pp_dp", devices=8, seconds=0.1, baseline="one device",
                        baseline_seconds=0.2, tokens_per_second=12000.0, first_loss=6.5, last_loss=1.3,
                        collectives={"send": 8})
        jax = record(bench="train", part="recipe", name="dp", backend="jax-cpu", devices=8, seconds=0.2,
                     tokens_per_second=9000.0)
        bubble = record(bench="train", part="bubble", name="interleaved", devices=4, seconds=1.0,
                        baseline="the ideal bubble", baseline_seconds=1.1, bubble=0.174, bubble_ideal=0.158,
                        bubble_table=0.158, stages=4, microbatches=8, chunks=2, tokens_per_second=100.0,
                        config={"layers": 16, "batch": 16, "vocab": 64})
        with tempfile.TemporaryDirectory() as d:
            report.save(d, report.load(d), {"train": {"status": "ok", "notes": [], "records": [recipe, jax, bubble]}})
            with redirect_stderr(io.StringIO()):
                report.render(d, report.load(d), "matplotlib is not installed")
            md = read(os.path.join(d, "report.md"))
            self.assertIn("| pp_dp | 8 | 12000 | 2.00 | 6.500 -> 1.300 | - | - | send 8 |", md)
            self.assertIn("| interleaved | threads | 4 | 8 | 2 | 64 | 0.174 | 0.158 | +10 % | 1000.0 |", md)

    def test_ring_attention_against_jax_s_fastest_form_on_the_same_shape_failed_forms_left_out(self):
        shape = {"batch": 1, "seq": 1024, "heads": 8, "head_dim": 64}
        ring = record(bench="grad", part="context", name="context parallel (ring)", devices=8, seconds=0.5, shape=shape)
        zz = dict(ring, name="context parallel (ring, zig-zag)", seconds=0.4)
        jax = [record(bench="grad", part="context", name="jax sequence split", backend="jax-cpu", devices=8, seconds=0.6,
                      shape=shape),
               record(bench="grad", part="context", name="jax heads split", backend="jax-cpu", devices=8, seconds=0.9,
                      shape=shape),
               record(bench="grad", part="context", name="jax dot_product_attention", backend="jax-cpu", devices=8,
                      seconds=None, error="out of memory", shape=shape),
               # another shape: not compared
               record(bench="grad", part="context", name="jax sequence split", backend="jax-cpu", devices=8, seconds=0.1,
                      shape=dict(shape, seq=128))]
        figure = "ring attention fwd + bwd beside JAX's fastest form (causal, split sequence)"
        rows = lambda recs: {r[1]: r for r in goals.evaluate({"grad": recs})}  # noqa: E731
        row = rows([ring, zz] + jax)[figure]
        self.assertEqual(row[4], "pass")
        self.assertIn("worst 1.20x ((ring) 1024 8)", row[3])
        self.assertIn("median 1.35x of 2", row[3])
        ring["seconds"] = 0.7
        self.assertEqual(rows([ring, zz] + jax)[figure][4], "short")
        self.assertEqual(rows([ring, zz])[figure][4], "not measured")

    def test_grad_renders_the_context_parallel_records_in_a_table_of_their_own(self):
        from contextlib import redirect_stdout
        from harness import suites
        block = record(bench="grad", part="block", name="dp 8", devices=8, seconds=0.3, baseline="forward",
                       baseline_seconds=0.1, ratio=3.0, recorded_forward_seconds=0.12, backward_seconds=0.18,
                       backward_over_forward=1.5, gflops=10.0, baseline_gflops=11.0, collectives_forward=0,
                       collectives_recorded_forward=0, collectives_backward=3)
        cp = record(bench="grad", part="context", name="context parallel (all-to-all)", devices=8, seconds=0.012,
                    baseline="heads split", baseline_seconds=0.01, ratio=1.2, gflops=5.0, baseline_gflops=6.0,
                    collective_calls=8, bytes=3 * 2**20, baseline_bytes=0,
                    shape={"batch": 1, "seq": 1024, "heads": 8, "head_dim": 64}, vs_all_to_all=1.0,
                    peak_bytes=64 * 2**20)
        ring = dict(cp, name="context parallel (ring)", seconds=0.009, ratio=0.9, vs_all_to_all=0.75, collective_calls=44,
                    peak_bytes=8 * 2**20)
        # --blockwise-only: beside the all-to-all form's fused kernel alone (the unfused forms do not fit)
        alone = dict(cp, name="context parallel (ring)", seconds=2.5, baseline=None, baseline_seconds=None, ratio=None,
                     baseline_gflops=None, baseline_bytes=None, vs_all_to_all=1.09, all_to_all_kernel="fused",
                     peak_bytes=160 * 2**20, shape={"batch": 1, "seq": 16384, "heads": 8, "head_dim": 64})
        out = io.StringIO()
        with redirect_stdout(out):
            suites.grad_table([block, cp, ring, alone])
        self.assertIn("8 collectives, 3.00 MiB sent per device", out.getvalue())
        self.assertIn("0.75x the all-to-all form's time (unfused); 44 collectives", out.getvalue())
        self.assertIn("(the unfused forms' [S, S] scores do not fit); 1.09x the all-to-all form's time (fused)", out.getvalue())
        with tempfile.TemporaryDirectory() as d:
            report.save(d, report.load(d), {"grad": {"status": "ok", "notes": [], "records": [block, cp, ring, alone]}})
            with redirect_stderr(io.StringIO()):
                report.render(d, report.load(d), "matplotlib is not installed")
            md = read(os.path.join(d, "report.md"))
            self.assertIn("| context parallel (all-to-all) | 8 | 1024 | 12.0 | 10.0 | 1.20 | 1.00 | 3.00 | 64.0 |", md)
            self.assertIn("| context parallel (ring) | 8 | 1024 | 9.0 | 10.0 | 0.90 | 0.75 | 3.00 | 8.0 |", md)
            self.assertIn("| context parallel (ring) | 8 | 16384 | 2500.0 | - | - | 1.09 | 3.00 | 160.0 |", md)

    def test_grad_renders_the_moe_records_beside_the_dense_mlp(self):
        from contextlib import redirect_stdout
        from harness import suites
        moe = record(bench="grad", part="moe", name="moe top-2, cf 1", devices=8, seconds=0.2, baseline="dense MLP, same FLOPs per token",
                     baseline_seconds=0.16, ratio=1.25, gflops=30.0, baseline_gflops=37.5, collective_calls=6, bytes=2 * 2**20,
                     baseline_bytes=0, top_k=2, capacity_factor=1.0, capacity=128, dropped=175, choices=2048,
                     shape={"tokens": 1024, "dmodel": 512, "experts": 16, "expert_hidden": 1024, "dense_hidden": 2048})
        out = io.StringIO()
        with redirect_stdout(out):
            suites.grad_table([moe])
        self.assertIn("16 experts of 1024 (top-2, capacity factor 1: 175 of 2048 choices dropped)", out.getvalue())
        with tempfile.TemporaryDirectory() as d:
            report.save(d, report.load(d), {"grad": {"status": "ok", "notes": [], "records": [moe]}})
            with redirect_stderr(io.StringIO()):
                report.render(d, report.load(d), "matplotlib is not installed")
            md = read(os.path.join(d, "report.md"))
            self.assertIn("| moe top-2, cf 1 | 8 | 1024 | 16 | 200.0 | 160.0 | 1.25 | 175 / 2048 | 2.00 |", md)


if __name__ == "__main__":
    unittest.main(verbosity=1)
