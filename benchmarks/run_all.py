"""Run every benchmark and regenerate ``docs/benchmarks.md`` from what they wrote.

::

    python benchmarks/run_all.py --quick          # what `make bench` runs
    python benchmarks/run_all.py --docs-only      # rebuild the page from bench-output/

Runs ``transport``, ``listing``, ``dataloading``, ``sizes``, ``checkpoint``,
``soak``, ``shards``, ``scale``, ``scale_sim`` and ``zonal`` in that order (``--quick`` passes ``--quick`` to each),
skipping any whose script does not exist yet. Each one's stdout is echoed
and kept in ``bench-output/<name>.stdout.txt``; its last line must be
``RESULT {json}``.
The page gets the machine, the date, the commands, each benchmark's summary
(its docstring's first paragraph), its RESULT as a table, its printed tables,
and its figures (copied from ``bench-output/`` into ``docs/img/``).

Exit status: 0 when every benchmark that exists ran and printed its RESULT,
1 otherwise (the page is written either way).
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

BENCHMARKS = [
    "transport",
    "listing",
    "dataloading",
    "sizes",
    "checkpoint",
    "soak",
    "shards",
    "scale",
    "scale_sim",
    "zonal",
]
DOCS = h.ROOT / "docs"
IMG = DOCS / "img"
PAGE = DOCS / "benchmarks.md"
HISTORY = DOCS / "benchmarks-history.md"
RESULT_PREFIX = "RESULT "


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    p.add_argument("--docs-only", action="store_true", help="only rebuild the page")
    p.add_argument("--only", default=None, help="comma-separated benchmarks to run")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    return p.parse_args(argv)


def script_of(name: str) -> Path:
    return h.BENCH_DIR / f"{name}.py"


def run_one(name: str, quick: bool, timeout: float) -> dict[str, Any]:
    """Run one benchmark, echoing and keeping its stdout; return its status."""
    cmd = [sys.executable, str(script_of(name))] + (["--quick"] if quick else [])
    shown = " ".join(["python", f"benchmarks/{name}.py"] + (["--quick"] if quick else []))
    print(f"\n=== {shown}", flush=True)
    h.OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    out_path = h.OUTPUT_DIR / f"{name}.stdout.txt"
    t0 = time.monotonic()
    lines: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=h.ROOT)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
            if time.monotonic() - t0 > timeout:
                proc.kill()
                break
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.kill()
        raise
    elapsed = time.monotonic() - t0
    out_path.write_text("".join(lines))
    result = parse_result(lines)
    status = {
        "name": name,
        "command": shown,
        "returncode": rc,
        "seconds": round(elapsed, 1),
        "ok": rc == 0 and result is not None,
    }
    (h.OUTPUT_DIR / f"{name}.status.json").write_text(json.dumps(status, indent=2) + "\n")
    return status


def parse_result(lines: list[str]) -> dict[str, Any] | None:
    """The JSON of the last ``RESULT`` line, if any."""
    for line in reversed(lines):
        if line.startswith(RESULT_PREFIX):
            try:
                value = json.loads(line[len(RESULT_PREFIX) :])
            except ValueError:
                return None
            return value if isinstance(value, dict) else {"value": value}
    return None


# ------------------------------------------------------------------ the page


def summary_of(name: str) -> str:
    """The first paragraph of a benchmark's module docstring."""
    try:
        doc = ast.get_docstring(ast.parse(script_of(name).read_text())) or ""
    except (OSError, SyntaxError):
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, (dict, list)):
        return "`" + json.dumps(value, sort_keys=True) + "`"
    if value is None:
        return "-"
    return str(value).replace("|", "\\|")


def result_table(result: dict[str, Any]) -> list[str]:
    """RESULT as a two-column Markdown table (nested ``goals`` flattened)."""
    rows = ["| key | value |", "|---|---|"]
    for key in sorted(result):
        value = result[key]
        if key == "goals" and isinstance(value, dict):
            for goal, met in sorted(value.items()):
                rows.append(f"| goal: {goal} | {'met' if met else '**not met**'} |")
        else:
            rows.append(f"| {key} | {_cell(value)} |")
    return rows


def figures_of(name: str) -> list[Path]:
    """PNGs a benchmark wrote: its JSON's ``figure``/``figures``, else ``<name>*.png``."""
    found: list[Path] = []
    doc_path = h.OUTPUT_DIR / f"{name}.json"
    if doc_path.exists():
        try:
            doc = json.loads(doc_path.read_text())
        except ValueError:
            doc = {}
        listed = doc.get("figures") or ([doc["figure"]] if doc.get("figure") else [])
        for item in listed:
            p = Path(item)
            p = p if p.is_absolute() else h.ROOT / p
            if p.exists():
                found.append(p)
    if not found:
        found = sorted(h.OUTPUT_DIR.glob(f"{name}*.png"))
    return found


def printed_text(name: str) -> str:
    """What a benchmark printed, without its RESULT line."""
    path = h.OUTPUT_DIR / f"{name}.stdout.txt"
    if not path.exists():
        return ""
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith(RESULT_PREFIX)]
    return "\n".join(lines).strip("\n")


def machine_of(names: list[str]) -> dict[str, Any]:
    """The machine a benchmark JSON recorded (the first found), else this one."""
    for name in names:
        path = h.OUTPUT_DIR / f"{name}.json"
        if path.exists():
            try:
                machine = json.loads(path.read_text()).get("machine")
            except ValueError:
                continue
            if machine:
                return dict(machine)
    return h.machine_info()


def build_page(statuses: dict[str, dict[str, Any]], quick: bool) -> str:
    present = [n for n in BENCHMARKS if script_of(n).exists()]
    machine = machine_of(present)
    flag = " --quick" if quick else ""
    out = [
        "# Benchmarks",
        "",
        "<!-- Generated by benchmarks/run_all.py from bench-output/. Sections updated from a"
        " later run of one benchmark say so, with its command and date. -->",
        "",
        "Every benchmark runs against the local emulator's model store "
        '(`torchbucket.emulator`, see docs/architecture.md, "The emulator"), with the '
        "contenders side by side in one run, each in its own process. Figures are "
        "medians; ratios matter more than absolute numbers, which depend on the machine.",
        "",
        "Reproduce with `make bench`, which runs:",
        "",
        "```sh",
        "benchmarks/setup_bench_env.sh        # .venv-bench: google-cloud-storage<3, gcs-torch-dataflux;"
        " .venv-gcsfs: gcsfs, webdataset",
        f"python benchmarks/run_all.py{flag}",
        "```",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| date | {machine.get('date_utc', '-')} |",
        f"| CPUs (nproc) | {machine.get('nproc', '-')} |",
        f"| RAM | {machine.get('ram_gib', '-')} GiB |",
        f"| CPU model | {machine.get('cpu_model', '-')} |",
        f"| Python / torch | {machine.get('python', '-')} / {machine.get('torch', '-')} |",
        f"| load average at start | {_cell(machine.get('loadavg'))} |",
        "",
    ]
    # A hand-kept summary of the latest figures (benchmarks/summary.md) opens the page.
    summary_md = Path(__file__).with_name("summary.md")
    if summary_md.exists():
        out[2:2] = [summary_md.read_text().rstrip(), ""]
    IMG.mkdir(parents=True, exist_ok=True)
    for name in BENCHMARKS:
        out += [f"## {name}", ""]
        if not script_of(name).exists():
            out += [f"`benchmarks/{name}.py` does not exist yet.", ""]
            continue
        summary = summary_of(name)
        if summary:
            out += [summary, ""]
        status = statuses.get(name) or _stored_status(name)
        command = (status or {}).get("command", f"python benchmarks/{name}.py{flag}")
        out += [f"Command: `{command}`", ""]
        if status and not status.get("ok"):
            out += [
                f"**This run failed** (exit status {status.get('returncode')}); "
                f"see `bench-output/{name}.stdout.txt`.",
                "",
            ]
        stdout_path = h.OUTPUT_DIR / f"{name}.stdout.txt"
        json_path = h.OUTPUT_DIR / f"{name}.json"
        json_result = _json_result(name)
        # The benchmark ran again outside run_all: its JSON is the newer record.
        stale = (
            json_result is not None
            and stdout_path.exists()
            and json_path.stat().st_mtime > stdout_path.stat().st_mtime + 5
        )
        result = None
        if stdout_path.exists() and not stale:
            result = parse_result(stdout_path.read_text().splitlines())
        if result is None:
            result = json_result
        if result is None:
            out += ["No RESULT recorded yet.", ""]
            continue
        if status and not stale:
            out += [f"Took {status.get('seconds', '-')} s.", ""]
        out += ["### Result", "", *result_table(result), ""]
        text = "" if stale else printed_text(name)
        if text:
            out += ["### Output", "", "```text", text, "```", ""]
        for fig in figures_of(name):
            shutil.copyfile(fig, IMG / fig.name)
            out += [f"![{name}: {fig.stem}](img/{fig.name})", ""]
    # Earlier runs live in a page of their own, kept by hand; the page ends by pointing to it.
    if HISTORY.exists():
        out += [
            "## History",
            "",
            "Earlier runs, with their tables, logs and notes, are in"
            f" [Benchmarks: earlier runs]({HISTORY.name}).",
            "",
        ]
    return "\n".join(out).rstrip("\n") + "\n"


def _json_result(name: str) -> dict[str, Any] | None:
    """The ``result`` a benchmark wrote into its JSON file, when it has one."""
    path = h.OUTPUT_DIR / f"{name}.json"
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text()).get("result")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, dict) else None


def _stored_status(name: str) -> dict[str, Any] | None:
    path = h.OUTPUT_DIR / f"{name}.status.json"
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text())
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = BENCHMARKS if not args.only else [n for n in BENCHMARKS if n in args.only.split(",")]
    statuses: dict[str, dict[str, Any]] = {}
    if not args.docs_only:
        for name in names:
            if not script_of(name).exists():
                print(f"\n=== benchmarks/{name}.py does not exist yet: skipped", flush=True)
                continue
            statuses[name] = run_one(name, args.quick, args.timeout)
    DOCS.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(build_page(statuses, args.quick or args.docs_only))
    print(f"\nwrote {h.rel(PAGE)}")
    failed = [n for n, s in statuses.items() if not s["ok"]]
    for name, s in statuses.items():
        print(f"  {name:12s} {'ok' if s['ok'] else 'FAILED'}  {s['seconds']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
