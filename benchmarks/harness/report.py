"""The benchmark report: benchmarks/report/ (or --report DIR) with records.json (every benchmark's
records, notes and status, merged over runs), report.md and a self-contained report.html with the
same content, and the plots as PNGs (matplotlib from the benchmarks' virtual environment; without
it the report has its tables and says why the plots are missing).

At the top: the machine (CPU, cores, memory, compiler, Kokkos, BLAS and the kernel it runs, the
peers' versions), then the goals table (the bars of the project's issues: figure, goal, measured,
pass/short), then a section per benchmark: its status and notes, its plot(s) with the physical
limit, the goal and the peers drawn in, and a table of the figures beside the peers'.

Run as a script (`python report.py DIR`) it renders DIR/records.json; benchmarks/run calls it so
under the venv's python when its own python has no matplotlib.
"""
import base64
import datetime
import html
import json
import os
import platform
import re
import subprocess
import sys

if __package__ in (None, ""):  # run as a script: the package by path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from harness import goals as goals_mod  # noqa: E402
    from harness import plots as plots_mod  # noqa: E402
    from harness.runner import BUILD, ROOT  # noqa: E402
else:
    from . import goals as goals_mod
    from . import plots as plots_mod
    from .runner import BUILD, ROOT

ORDER = ["collectives", "reshard", "ops", "grad", "train", "loops", "stencil", "io", "compile"]
TITLES = {
    "collectives": "Collectives: bandwidth against the memcpy limit and raw MPI",
    "reshard": "Resharding: against the hand-written call, JAX and DTensor",
    "ops": "Operators: per-op overhead, GEMM against the core's peak, kernels against copy bandwidth, the MLP block",
    "grad": "Gradients: the transformer block forward and forward + backward, beside JAX",
    "train": "Training recipes: tokens per second beside JAX",
    "loops": "Data-parallel loops against hand-written loops",
    "stencil": "Stencils and ghost exchange",
    "io": "Checkpoints: save and load bandwidth",
    "compile": "Compile time of user translation units",
}


# ---- records.json ------------------------------------------------------------------------------

def load(folder):
    """The saved report data of `folder` ({"sections": {}} when none or unreadable)."""
    try:
        with open(os.path.join(folder, "records.json")) as f:
            data = json.load(f)
        if isinstance(data, dict) and isinstance(data.get("sections"), dict):
            return data
    except (OSError, ValueError):
        pass
    return {"format": 1, "sections": {}}


def save(folder, saved, sections):
    """`sections` merged into `saved` (replacing those benchmarks), the machine described anew,
    written to folder/records.json (atomically: a crash leaves the previous file). Returns it."""
    saved.setdefault("sections", {}).update(sections)
    saved["machine"] = machine()
    saved["format"] = 1
    path = os.path.join(folder, "records.json")
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(saved, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        print(f"benchmarks/run: cannot save the records to {path}: {e}", file=sys.stderr)
    return saved


# ---- the machine -------------------------------------------------------------------------------

def _read(path):
    with open(path) as f:
        return f.read()


def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


_machine = None


def machine():
    """What the figures were measured on, as (label, value) pairs."""
    global _machine
    if _machine is not None:
        return _machine
    info = []
    cpu = ""
    try:
        for line in _read("/proc/cpuinfo").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info.append(("CPU", cpu or platform.processor() or "?"))
    info.append(("cores (usable by this process)", str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                                         else os.cpu_count())))
    try:
        kb = next(int(line.split()[1]) for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal"))
        info.append(("memory", f"{kb / 2**20:.1f} GiB"))
    except (OSError, StopIteration, ValueError):
        pass
    osname = ""
    try:
        osname = next(line.split("=", 1)[1].strip().strip('"') for line in _read("/etc/os-release").splitlines()
                      if line.startswith("PRETTY_NAME"))
    except (OSError, StopIteration):
        pass
    info.append(("OS", f"{osname} ({platform.system()} {platform.release()})"))
    cxx = ""
    try:
        cmd = json.loads(_read(os.path.join(BUILD, "compile_commands.json")))[0]["command"].split()
        cmd = [c for c in cmd if os.path.basename(c) not in ("ccache", "sccache")]
        cxx = _run([cmd[0], "--version"]).splitlines()[0]
    except (OSError, ValueError, IndexError, KeyError):
        pass
    info.append(("compiler", cxx or "?"))
    try:
        opts = json.loads(_read(os.path.join(BUILD, "meson-info", "intro-buildoptions.json")))
        flags = next((" ".join(o["value"]) for o in opts if o["name"] == "cpp_args"), "")
        bt = next((o["value"] for o in opts if o["name"] == "buildtype"), "")
        info.append(("build", f"{bt}, cpp_args: {flags or '(none)'}"))
    except (OSError, ValueError):
        pass
    deps = _run(["meson", "introspect", "--dependencies", BUILD])
    try:
        for d in json.loads(deps):
            if d["name"].lower() in ("kokkos", "eigen3", "openblas", "blis", "ompi-cxx", "mpi", "hdf5-serial", "cuda", "nccl"):
                info.append((d["name"], d.get("version", "?")))
    except ValueError:
        pass
    kernel = ""
    for exe in ("bench_ops", "bench_grad", "bench_train", "bench_collectives"):
        path = os.path.join(BUILD, "benchmarks", exe)
        if os.access(path, os.X_OK):
            kernel = _run([path, "--blas-kernel"])
            break
    info.append(("BLAS kernel in use", kernel or "?"))
    if os.environ.get("OPENBLAS_CORETYPE"):
        info.append(("OPENBLAS_CORETYPE", os.environ["OPENBLAS_CORETYPE"] + " (forced by the environment)"))
    mpirun = _run(["mpirun", "--version"]).splitlines()
    if mpirun:
        info.append(("mpirun", mpirun[0]))
    venv_py = os.path.join(BUILD, "peers-venv", "bin", "python")
    if os.access(venv_py, os.X_OK):
        code = ("import importlib.metadata as m, platform\n"
                "out=['python '+platform.python_version()]\n"
                "for p in ('jax','jaxlib','torch','numpy','matplotlib'):\n"
                "  try: out.append(p+' '+m.version(p))\n"
                "  except Exception: pass\n"
                "print(', '.join(out))")
        info.append(("peers (build-bench/peers-venv)", _run([venv_py, "-c", code]) or "?"))
    commit = _run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    dirty = _run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])
    info.append(("shardlib", (commit or "?") + (" with uncommitted changes" if dirty else "")))
    _machine = info
    return info


# ---- blocks: one content, two renderings (Markdown and HTML) ------------------------------------

class Doc:
    def __init__(self):
        self.blocks = []

    def h(self, level, text):
        self.blocks.append(("h", level, text))

    def p(self, text):
        self.blocks.append(("p", text))

    def table(self, header, rows):
        if rows:
            self.blocks.append(("table", header, rows))

    def image(self, path, alt):
        self.blocks.append(("img", path, alt))

    def pre(self, text):
        self.blocks.append(("pre", text))

    def markdown(self):
        out = []
        for b in self.blocks:
            if b[0] == "h":
                out.append("#" * b[1] + " " + b[2])
            elif b[0] == "p":
                out.append(b[1])
            elif b[0] == "table":
                cell = lambda c: str(c).replace("|", "\\|").replace("\n", " ")  # noqa: E731
                out.append("| " + " | ".join(cell(c) for c in b[1]) + " |\n|" + "---|" * len(b[1]) + "\n" +
                           "\n".join("| " + " | ".join(cell(c) for c in r) + " |" for r in b[2]))
            elif b[0] == "img":
                out.append(f"![{b[2]}]({os.path.basename(b[1])})")
            elif b[0] == "pre":
                out.append("```\n" + b[1].rstrip() + "\n```")
        return "\n\n".join(out) + "\n"

    def html(self, title):
        def inline(t):
            t = html.escape(t)
            t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
            return re.sub(r"`(.+?)`", r"<code>\1</code>", t)
        out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
               "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
               "table{border-collapse:collapse;margin:1em 0;font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px;"
               "text-align:left}th{background:#eee}img{max-width:100%}pre{background:#f6f6f6;padding:.5em;"
               "overflow-x:auto}.pass{color:#070}.short{color:#b00}</style></head><body>"]
        for b in self.blocks:
            if b[0] == "h":
                anchor = re.sub(r"[^a-z0-9]+", "-", b[2].lower()).strip("-")
                out.append(f"<h{b[1]} id='{anchor}'>{inline(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                out.append(f"<p>{inline(b[1])}</p>")
            elif b[0] == "table":
                def td(c):
                    c = str(c)
                    cls = " class='pass'" if c.startswith("pass") else " class='short'" if c.startswith("short") else ""
                    return f"<td{cls}>{inline(c)}</td>"
                out.append("<table><tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in b[1]) + "</tr>" +
                           "".join("<tr>" + "".join(td(c) for c in r) + "</tr>" for r in b[2]) + "</table>")
            elif b[0] == "img":
                try:
                    with open(b[1], "rb") as f:
                        data = base64.b64encode(f.read()).decode()
                    out.append(f"<p><img alt='{html.escape(b[2])}' src='data:image/png;base64,{data}'></p>")
                except OSError:
                    pass
            elif b[0] == "pre":
                out.append(f"<pre>{html.escape(b[1])}</pre>")
        out.append("</body></html>")
        return "\n".join(out)


# ---- the report --------------------------------------------------------------------------------

def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def write(folder, saved, total_seconds=None):
    """Renders folder/report.md, report.html and the PNGs: here when this python has matplotlib,
    else under the benchmarks' venv's python (installing matplotlib there), else without plots."""
    if total_seconds is not None:
        saved["last_run_seconds"] = total_seconds
        save(folder, saved, {})
    if have_matplotlib():
        return render(folder, saved, None)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from peers import venv  # noqa: E402
    py = venv.ensure_venv(os.path.join(BUILD, "peers-venv"), ["matplotlib"])
    if py is not None:
        r = subprocess.run([py, os.path.abspath(__file__), folder])
        if r.returncode == 0:
            return
        why = f"the plotting process failed (exit {r.returncode})"
    else:
        why = f"matplotlib could not be installed ({venv.last_error})"
    print(f"benchmarks/run: the report has no plots: {why}", file=sys.stderr)
    render(folder, saved, why)


def render(folder, saved, no_plots_why):
    sections = saved.get("sections", {})
    doc = Doc()
    doc.h(1, "shardlib benchmark report")
    dates = sorted({s.get("date", "") for s in sections.values() if s.get("date")})
    when = dates[-1] if dates else "?"
    doc.p(f"Made {datetime.datetime.now().astimezone().isoformat(timespec='seconds')} from the records of "
          f"{len(sections)} benchmark(s) (last run {when}" +
          (f", {saved['last_run_seconds'] / 60:.1f} minutes" if saved.get("last_run_seconds") else "") + "). "
          "Times are medians; `ours` is shardlib; the peers ran in the same run on the same machine with the same "
          "shapes. Ratios say who is faster and by how much.")
    if no_plots_why:
        doc.p(f"**No plots**: {no_plots_why}.")
    doc.h(2, "Machine")
    doc.table(["", ""], [list(x) for x in saved.get("machine", machine())])

    records = {name: s.get("records", []) for name, s in sections.items()}
    doc.h(2, "Goals")
    rows = goals_mod.evaluate(records)
    n_pass = sum(1 for r in rows if r[4].startswith("pass"))
    n_short = sum(1 for r in rows if r[4].startswith("short"))
    doc.p(f"The bars the project's issues set, measured in this report: {n_pass} pass, {n_short} short, "
          f"{len(rows) - n_pass - n_short} not measured (their benchmark did not run or has no such case).")
    doc.table(["area", "figure", "goal", "measured", "result"], rows)

    doc.h(2, "Sections")
    doc.table(["benchmark", "status", "run", "minutes", "records (ours / peers)", "notes"],
              [[name, sections[name].get("status", "?"), sections[name].get("date", "?"),
                f"{sections[name].get('seconds', 0) / 60:.1f}",
                f"{sum(1 for r in records[name] if not is_peer(r))} / {sum(1 for r in records[name] if is_peer(r))}",
                str(len(sections[name].get("notes", [])))]
               for name in ORDER + sorted(set(sections) - set(ORDER)) if name in sections])
    for name in ORDER + sorted(set(sections) - set(ORDER)):
        if name not in sections:
            continue
        s = sections[name]
        doc.h(2, TITLES.get(name, name))
        doc.p(f"Status: **{s.get('status', '?')}**; run {s.get('date', '?')} by `{s.get('command', '?')}`, "
              f"{s.get('seconds', 0):.0f} s.")
        for note in s.get("notes", []):
            if "\n" in note:
                first, rest = note.split("\n", 1)
                doc.p("Note: " + first)
                doc.pre(rest)
            else:
                doc.p("Note: " + note)
        recs = records[name]
        if not recs:
            doc.p("No records: this benchmark did not run (see the notes).")
            continue
        if not no_plots_why:
            try:
                for path, alt in plots_mod.plot(name, recs, folder):
                    doc.image(path, alt)
            except Exception as e:  # noqa: BLE001 -- a plot that fails leaves the tables
                doc.p(f"(the plots of this section failed: {type(e).__name__}: {e})")
        for title, header, rows in plots_mod.tables(name, recs):
            if title:
                doc.p(f"**{title}**")
            doc.table(header, rows)
    md = doc.markdown()
    try:
        with open(os.path.join(folder, "report.md"), "w") as f:
            f.write(md)
        with open(os.path.join(folder, "report.html"), "w") as f:
            f.write(doc.html("shardlib benchmark report"))
    except OSError as e:
        sys.exit(f"benchmarks/run: cannot write the report to {folder}: {e}")
    print(f"report: {os.path.join(folder, 'report.md')} and report.html ({n_pass} goals pass, {n_short} short)",
          file=sys.stderr)


def is_peer(r):
    return r.get("backend") in ("jax-cpu", "dtensor-gloo")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: report.py DIR (renders DIR/records.json into DIR/report.md, report.html and PNGs)")
    render(sys.argv[1], load(sys.argv[1]), None if have_matplotlib() else "matplotlib is not installed")
