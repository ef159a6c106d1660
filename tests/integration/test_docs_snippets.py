"""Every code block of README.md and docs/guide/*.md runs, in order, per page.

Each page runs in a fresh Python process (tests/integration/_docs_driver.py)
in an empty working folder, against a fresh emulator holding a bucket named
``my-bucket``:

- ``python`` blocks run with ``exec``; on README.md each block gets a fresh
  namespace (each must run as written, alone), on a guide page the blocks share
  one, as a reader running the page top to bottom would.
- ``sh``/``bash`` blocks run in bash; ``console`` blocks run their ``$ `` lines.
  What a block exports carries on to the next blocks.
- A page whose blocks start the emulator themselves (README's "Try it
  locally": ``torchbucket emulator --port 4443 ... &``) gets no emulator from
  the test; the port is replaced with a free one, and the driver waits for the
  emulator to answer before the next block, as a person would wait for its
  banner. Every other page gets an emulator started here, with
  ``gs://my-bucket/train/`` (and ``./images``) holding
  ``examples/make_images.py``'s images, as Getting started leaves them, which
  is what each guide page says its examples read.
- A block right after ``<!-- snippet: skip (reason) -->`` is not run: it
  needs a real bucket, cloud credentials or a GPU, or installs packages.

A page fails on a block that raises or exits non-zero, and on output that
holds a traceback or NumPy's "not writable" warning.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from torchbucket.emulator import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("_docs_driver.py")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
ISOLATED = {"README.md"}  # each python block alone: it must run as written
RUN_LANGS = {"python", "sh", "bash", "console"}
SKIP = re.compile(r"<!--\s*snippet:\s*skip\s*\((?P<why>[^)]+)\)\s*-->")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
BAD_OUTPUT = ("Traceback (most recent call last)", "is not writable")


@dataclass
class Block:
    lang: str
    code: str
    line: int
    skip: str | None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, in order, with their skip markers."""
    return blocks_in(page.read_text())


def blocks_in(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, in order, with their skip markers."""
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, lang, start = len(match["indent"]), match["lang"], i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        code = "\n".join(line[indent:] for line in lines[i + 1 : j]) + "\n"
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = SKIP.search(lines[k]) if k >= 0 else None
        found.append(Block(lang, code, start + 1, marker["why"] if marker else None))
        i = j + 1
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _starts_emulator(page_blocks: list[Block]) -> bool:
    return any(
        b.lang in {"sh", "bash", "console"} and b.skip is None and "torchbucket emulator" in b.code
        for b in page_blocks
    )


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONWARNINGS"] = "default"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run_driver(page: Path, steps: list[Block], workdir: Path, env: dict[str, str]) -> None:
    (workdir / "examples").symlink_to(ROOT / "examples")
    plan = workdir / ".snippets.json"
    plan.write_text(
        json.dumps(
            {
                "page": page.name,
                "isolated": page.name in ISOLATED,
                "blocks": [asdict(b) for b in steps],
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(plan)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{page.name}: a block failed\n{out[-6000:]}"
    for bad in BAD_OUTPUT:
        assert bad not in out, f"{page.name}: output holds {bad!r}\n{out[-6000:]}"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """examples/make_images.py's images, by name under the folder, made once."""
    folder = tmp_path_factory.mktemp("images")
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "make_images.py"), str(folder)],
        check=True,
        capture_output=True,
    )
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*.png")}


def _runnable(page: Path) -> bool:
    return any(b.lang in RUN_LANGS and b.skip is None for b in blocks(page))


# A page with nothing to run (the guide's index) is not a test.
RUNNABLE = [p for p in PAGES if _runnable(p)]


@pytest.mark.parametrize("page", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_every_block_of_the_page_runs(page: Path, tmp_path: Path, images: dict[str, bytes]) -> None:
    page_blocks = [b for b in blocks(page) if b.lang in RUN_LANGS]
    steps = [b for b in page_blocks if b.skip is None]
    env = _env()
    if _starts_emulator(page_blocks):
        port = str(_free_port())
        for b in steps:
            if b.lang != "python":
                b.code = b.code.replace("4443", port)
        _run_driver(page, steps, tmp_path, env)
        return
    with Emulator(backend="model") as emu:
        emu.create_bucket("my-bucket")
        emu.seed("my-bucket", {f"train/{name}": data for name, data in images.items()})
        env["STORAGE_EMULATOR_HOST"] = emu.endpoint
        for name, data in images.items():  # ./images, as Getting started leaves it
            (tmp_path / "images" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "images" / name).write_bytes(data)
        _run_driver(page, steps, tmp_path, env)


def test_skips_are_few_and_say_why() -> None:
    for page in PAGES:
        page_blocks = [b for b in blocks(page) if b.lang in RUN_LANGS]
        skipped = [b for b in page_blocks if b.skip]
        assert len(skipped) <= max(2, len(page_blocks) // 3), (page.name, skipped)
        for b in skipped:
            assert len(b.skip or "") >= 8, (page.name, b.line)


def test_the_readme_is_a_landing_page() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    assert len(text.splitlines()) <= 300
    assert "make demo" in text and "make test" in text
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert max(len(c) for c in cells) <= 120, line
    # From a clean clone to a first batch: every command of the section, the
    # install included, at most six.
    try_it = text.split("## Try it locally", 1)[1].split("\n## ", 1)[0]
    commands = [
        ln
        for b in blocks_in(try_it)
        if b.lang == "sh"
        for ln in b.code.splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert "pip install" in commands[0] and len(commands) <= 6, commands


def test_user_docs_carry_no_commit_hashes_or_run_letters() -> None:
    hashes = re.compile(r"`[0-9a-f]{7,40}`")
    runs = re.compile(r"\b(?:quick|full) run [A-Z]{1,2}\b|\brun [A-Z]{1,2}\b[,;)]")
    for page in PAGES:
        text = page.read_text()
        assert not hashes.search(text), (page.name, hashes.search(text))
        assert not runs.search(text), (page.name, runs.search(text))


def _table_rows(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("| ")]


def test_the_figures_users_see_come_from_the_one_hand_kept_summary() -> None:
    # benchmarks/summary.md opens docs/benchmarks.md (run_all.py writes it
    # there); the README's results repeat its rows, never figures of their own.
    summary = (ROOT / "benchmarks" / "summary.md").read_text()
    rows = _table_rows(summary)
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    page_summary = page.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert _table_rows(page_summary) == rows
    results = (ROOT / "README.md").read_text().split("## Results", 1)[1].split("\n## ", 1)[0]
    readme_rows = _table_rows(results)
    assert len(readme_rows) >= 5
    assert not set(readme_rows) - set(rows), set(readme_rows) - set(rows)
