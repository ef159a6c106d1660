"""The benchmarks' zygote: a contender forked from it runs as a fresh ``python script arg`` would."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _harness as h
import _zygote as zg

# A cheap module stands for torch: the tests check the mechanism, not the import's cost.
PRELOAD = ("decimal", "tb_zygote_probe")

CONTENDER = textwrap.dedent(
    """
    import json, os, sys, time
    preloaded = "tb_zygote_probe" in sys.modules
    import tb_zygote_probe  # as a contender imports torchbucket
    spec = json.loads(sys.argv[1])
    print("to stderr", file=sys.stderr)
    if spec.get("raise"):
        raise ValueError("the contender failed")
    if spec.get("exit") is not None:
        sys.exit(spec["exit"])
    end = time.process_time() + spec.get("burn_s", 0)
    while time.process_time() < end:
        pass
    time.sleep(spec.get("sleep_s", 0))
    print("CONTENDER " + json.dumps({
        "name": __name__,
        "argv": sys.argv,
        "path0": sys.path[0],
        "emulator": os.environ.get("STORAGE_EMULATOR_HOST"),
        "probe": os.environ.get("TB_ZYGOTE_PROBE"),
        "preloaded": preloaded,
        "session_leader": os.getsid(0) == os.getpid(),
        "stdin": sys.stdin.read(),
    }))
    """
)


@pytest.fixture
def contender(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # A preloaded module that sets a variable at import, as torchbucket.storage.gcs does.
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "tb_zygote_probe.py").write_text(
        "import os\nos.environ.setdefault('TB_ZYGOTE_PROBE', 'set at import')\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{probe}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("TORCHBUCKET_BENCH_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setattr(h, "LOG_DIR", tmp_path / "out" / "logs")
    script = tmp_path / "scripts" / "contender.py"
    script.parent.mkdir()
    script.write_text(CONTENDER)
    return script


def test_a_forked_run_sees_what_a_fresh_interpreter_would(contender: Path) -> None:
    env = {"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"}
    with zg.Zygotes(PRELOAD) as zygotes:
        forked = h.run_contender("forked", contender, {"burn_s": 0.3}, env=env, zygotes=zygotes)
        # A second run from the same zygote: it served the first and still serves.
        again = h.run_contender("again", contender, {"n": 2}, env=env, zygotes=zygotes)
        zygote = zygotes.get(None, zg.start_env())
        assert zygote is not None and zygote.preloaded == list(PRELOAD)
    fresh = h.run_contender("fresh", contender, {"burn_s": 0.3}, env=env)
    for run in (forked, fresh):
        assert run.data["name"] == "__main__"
        assert run.data["argv"] == [str(contender), json.dumps({"burn_s": 0.3})]
        assert run.data["path0"] == str(contender.parent)
        assert run.data["emulator"] == "127.0.0.1:4443"
        assert run.data["probe"] == "set at import"
        assert run.data["session_leader"] is True
        assert run.data["stdin"] == ""
        assert run.process_cpu_s >= 0.25  # the child's CPU, from the zygote's wait4
        assert (h.LOG_DIR / f"{run.name}.log").read_text() == "to stderr\n"
    assert forked.data["preloaded"] is True and fresh.data["preloaded"] is False
    assert again.data["argv"][1] == json.dumps({"n": 2})


@pytest.mark.parametrize(
    ("spec", "status", "says"),
    [({"raise": True}, 1, "ValueError: the contender failed"), ({"exit": 3}, 3, "to stderr")],
)
def test_a_failing_forked_run_reports_its_status_and_log(
    contender: Path, spec: dict[str, object], status: int, says: str
) -> None:
    with zg.Zygotes(PRELOAD) as zygotes:
        with pytest.raises(h.ContenderError, match=f"exit status {status}, no result") as err:
            h.run_contender("failing", contender, spec, zygotes=zygotes)
        assert says in str(err.value)
        # The zygote outlives its child's failure.
        assert h.run_contender("next", contender, {}, zygotes=zygotes).data["name"] == "__main__"


def test_a_forked_run_past_its_timeout_is_killed_and_the_zygote_goes_on(contender: Path) -> None:
    with zg.Zygotes(PRELOAD) as zygotes:
        with pytest.raises(h.ContenderError, match=r"timed out after 1\.0 s"):
            h.run_contender("slow", contender, {"sleep_s": 60}, zygotes=zygotes, timeout=1.0)
        assert h.run_contender("next", contender, {}, zygotes=zygotes).data["name"] == "__main__"


def test_a_run_that_sets_what_is_read_at_start_gets_a_fresh_process(contender: Path) -> None:
    with zg.Zygotes(PRELOAD) as zygotes:
        # No zygote is started for an environment it would not serve.
        assert zygotes.get(None, {**zg.start_env(), "MALLOC_ARENA_MAX": "2"}) is None
        assert zygotes._by_python == {}
        run = h.run_contender(
            "malloc", contender, {}, env={"MALLOC_ARENA_MAX": "2"}, zygotes=zygotes
        )
        assert run.data["preloaded"] is False
        zygote = zygotes.get(None, zg.start_env())
        assert zygote is not None
        assert not zygote.serves(None, {**zg.start_env(), "PYTHONHASHSEED": "1"})
        assert not zygote.serves("/another/python", zg.start_env())
        assert zygote.serves(None, {**zg.start_env(), "STORAGE_EMULATOR_HOST": "elsewhere:1"})


def test_replies_that_arrive_together_are_each_read() -> None:
    # A child that ends at once: its pid and its exit reach the pipe in one
    # read. A buffered reader would hold the second where select() no longer
    # sees it, and the run would wait out its timeout.
    zygote = zg.Zygote.__new__(zg.Zygote)
    read_end, write_end = os.pipe()
    zygote._rep, zygote._buffer = read_end, b""
    try:
        os.write(write_end, b'{"pid": 7}\n{"status": 3, "cpu_s": 0.5, "maxrss_kb": 9}\n')
        assert zygote._reply(1.0) == {"pid": 7}
        assert zygote._reply(1.0) == {"status": 3, "cpu_s": 0.5, "maxrss_kb": 9}
        assert zygote._reply(0.05) is None
    finally:
        os.close(read_end)
        os.close(write_end)
