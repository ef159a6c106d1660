"""The benchmarks' code paths run end to end at tiny sizes (no assertion on speed).

Each benchmark runs with ``--smoke`` against its own emulator, writing into a
temporary folder: it must verify every byte, write its JSON and figure, and
end with the ``RESULT`` line its issue names.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# A smoke run is a code-path check, but on a slow or shared 2-core VM it takes
# minutes: checkpoint's took 237 s on 2026-12-02 (a VM at half its usual speed),
# so each has 540 s here, under pytest's own limit raised to 600 s.
pytestmark = [
    pytest.mark.emulator,
    pytest.mark.slow,
    pytest.mark.bench_smoke,
    pytest.mark.timeout(600),
]

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(
    name: str, tmp_path: Path, *args: str, timeout: float = 540, output: str | None = None
) -> dict[str, Any]:
    """Run ``benchmarks/<name>.py --smoke``; its RESULT, checked against its JSON.

    ``output``: the JSON's name when not ``name`` (and no figure is expected).
    """
    env = dict(os.environ, TORCHBUCKET_BENCH_OUTPUT=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--smoke", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), proc.stdout[-2000:]
    result: dict[str, Any] = json.loads(last[len("RESULT ") :])
    doc = json.loads((tmp_path / f"{output or name}.json").read_text())
    assert doc["result"] == result
    if output is None:
        assert (tmp_path / f"{name}.png").stat().st_size > 0
    return result


def test_transport_smoke_reports_cpu_per_object(tmp_path: Path) -> None:
    result = run_benchmark("transport", tmp_path)
    assert result["bytes_verified"] is True
    assert result["cpu_us_per_obj_torchbucket"] > 0
    assert result["cpu_us_per_obj_aiohttp"] > 0
    assert "cpu_us_per_obj_gcs_client" in result  # null without .venv-bench
    # Request accounting on vs patched out, side by side (issue 16).
    assert result["cpu_us_per_obj_torchbucket_no_accounting"] > 0
    assert "accounting_cpu_overhead_pct" in result


def test_dataloading_smoke_reports_the_issue_keys(tmp_path: Path) -> None:
    result = run_benchmark("dataloading", tmp_path, "--only", "tb_iter_compose,tb_map,aiohttp")
    assert result["bytes_verified"] is True
    assert result["composites_left"] == 0
    assert result["fraction_of_limit_10kib"] > 0
    assert result["client_cpu_ms_per_obj_10kib"] > 0
    for key in (
        "speedup_vs_dataflux_100kib",
        "speedup_vs_dataflux_10kib",
        "speedup_vs_naive_10kib",
        "speedup_vs_gcsfs_100kib",
        "speedup_vs_gcsfs_10kib",
    ):
        assert key in result  # null when those contenders were not run
    # Issue 19: both latency presets run by default and the tail figures are there.
    assert result["latency_presets"] == ["same-region", "same-region-tail"]
    assert result["tail_slowdown_100kib"] > 0
    assert result["tail_slowdown_limit_100kib"] > 0  # the bare loop's, for reference
    assert result["p99_batch_s_map_no_readahead_100kib"] > 0
    assert 0 <= result["hedged_request_fraction"] <= 1
    assert 0 <= result["read_around_fraction"] <= 1
    # A batch's fetch in the workers (each __getitems__ after a worker's first), both presets.
    for suffix in ("", "_constant"):
        p50 = result[f"p50_batch_fetch_s_map{suffix}_100kib"]
        assert 0 < p50 <= result[f"p99_batch_fetch_s_map{suffix}_100kib"]


def test_dataloading_zonal_smoke_compares_with_gcsfs_on_the_grpc_endpoint(
    tmp_path: Path,
) -> None:
    # Issue 42: torchbucket's defaults on a zonal bucket over gRPC, gcsfs's batched
    # cat on the same endpoint, torchbucket on a regional bucket over HTTP.
    result = run_benchmark(
        "dataloading",
        tmp_path,
        "--zonal",
        "--datasets",
        "10kib",
        "--only",
        "tb_zonal_iter,gcsfs_zonal_cat,tb_regional_iter",
        output="dataloading_zonal",
    )
    assert result["best_zonal_10kib"] == "tb_zonal_iter"
    assert result["best_regional_10kib"] == "tb_regional_iter"
    assert result["speedup_zonal_vs_regional_10kib"] > 0
    for who in ("zonal", "regional"):
        assert result[f"client_cpu_ms_per_mib_{who}_10kib"] > 0
        assert result[f"server_cpu_ms_per_mib_{who}_10kib"] > 0
    if "fsspec_versions" in result:  # gcsfs ran (.venv-gcsfs exists)
        assert result["speedup_vs_gcsfs_zonal_10kib"] > 0
        assert result["client_cpu_ms_per_mib_zonal_gcsfs_10kib"] > 0


def test_shards_zonal_smoke_compares_with_webdataset_on_the_grpc_endpoint(
    tmp_path: Path,
) -> None:
    # Issue 42: packed shards on a zonal bucket, torchbucket over gRPC against
    # webdataset over gcsfs on the same endpoint, and on the regional bucket.
    result = run_benchmark(
        "shards",
        tmp_path,
        "--zonal",
        "--only",
        "tb_shards_zonal,wds_gcsfs_zonal,tb_shards_regional",
        output="shards_zonal",
    )
    for ds in ("10kib", "100kib"):
        assert result[f"best_zonal_shards_{ds}"] == "tb_shards_zonal"
        assert result[f"speedup_zonal_vs_regional_shards_{ds}"] > 0
        assert result[f"client_cpu_ms_per_mib_zonal_shards_{ds}"] > 0
        assert result[f"server_cpu_ms_per_mib_zonal_shards_{ds}"] > 0
        if "fsspec_versions" in result:  # webdataset and gcsfs ran (.venv-gcsfs exists)
            assert result[f"speedup_vs_gcsfs_zonal_shards_{ds}"] > 0


def test_shards_smoke_reports_the_issue_keys(tmp_path: Path) -> None:
    result = run_benchmark("shards", tmp_path, "--only", "tb_shards,tb_compose")
    assert result["samples_per_s_shards_10kib"] > 0
    assert result["requests_per_sample_10kib"] > 0
    for key in ("speedup_vs_compose_10kib", "speedup_vs_webdataset_10kib", "first_batch_s_100kib"):
        assert key in result
    # Issue 19: both latency presets by default, the tail's cost reported.
    assert result["latency_presets"] == ["same-region", "same-region-tail"]
    assert result["tail_slowdown_shards_10kib"] > 0
    assert result["tail_slowdown_compose_10kib"] > 0


def test_tail_epochs_smoke_splits_the_tails_cost(tmp_path: Path) -> None:
    result = run_benchmark("tail_epochs", tmp_path)
    assert result["counts"] == [256, 1024]
    assert result["composites_left"] == 0
    assert result["composites_left_in_buckets"] == 0
    for path in ("iterable", "map", "iterable_no_anchor", "map_no_anchor"):
        for n in result["counts"]:
            assert result[f"tail_slowdown_{path}_{n}"] > 0
        assert f"tail_fixed_cost_s_{path}" in result
        # A line through the smoke's two sizes: its slope is a fitted number,
        # not a sign to rely on (two short epochs on a busy VM can come out
        # with the larger one faster: the fixed cost dominates at 256 and 1,024).
        assert math.isfinite(result[f"fit_{path}"]["same-region"]["us_per_object"])
        assert result[f"first_batch_s_{path}_same_region_tail"] > 0
    assert result["server_cpu_fraction_max"] > 0
    assert 0 <= result["tail_runs_with_compose_stalled_before"] <= result["tail_runs"] == 8
    assert "anchor_saves_s_iterable" in result


def test_window_timeline_smoke_splits_the_waits(tmp_path: Path) -> None:
    result = run_benchmark("window_timeline", tmp_path)
    assert (result["count"], result["object_size"]) == (512, 10 << 10)
    assert result["composites_left"] == 0
    for path in ("iterable", "map"):
        assert result[f"tail_slowdown_{path}"] > 0
        for preset in ("same_region", "same_region_tail"):
            # Parsed from the workers' DEBUG timeline: a window started, its
            # first composed group arrived, and the epoch's drain was logged.
            assert result[f"worker_start_s_{path}_{preset}"] > 0
            assert result[f"first_group_s_{path}_{preset}"] > 0
            assert result[f"group_path_p50_s_{path}_{preset}"] > 0
            assert result[f"drain_s_{path}_{preset}"] >= 0
            assert result[f"startup_wait_s_{path}_{preset}"] >= 0
    assert result["server_cpu_fraction_max"] > 0


def test_varied_sizes_smoke_reads_objects_of_many_sizes(tmp_path: Path) -> None:
    result = run_benchmark("varied_sizes", tmp_path)
    assert result["composites_left"] == 0
    for key, distinct in (("2-30kib", 300), ("512kib-2mib", 48)):
        assert result[f"distinct_sizes_{key}"] == distinct
        assert result[f"default_fraction_of_limit_{key}"] > 0
        assert result[f"client_cpu_ms_per_mib_{key}"] > 0
        for contender in ("map_default", "iter_default", "aiohttp"):
            assert result[f"samples_per_s_{contender}_{key}"] > 0
    assert result["mean_object_kib_2-30kib"] == 16.0
    assert result["server_cpu_fraction_max"] > 0


# The longest: torch's FsspecReader reads the smoke's 32 MiB in 1,667 requests
# (21-28 s a load), besides gcsfs and both DCP savers (each DCP run starts two
# ranks: ~27 s). Under the constant preset only, which halves it (221 -> ~110 s
# on a slow VM); the tail's figures are checked on torchbucket alone below.
@pytest.mark.timeout(960)
def test_checkpoint_smoke_against_gcsfs_and_torchs_fsspec_dcp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (ROOT / ".venv-gcsfs" / "bin" / "python").exists():
        # The test environment has gcsfs and google-cloud-storage>=3 (the dev
        # extra), which is all the fsspec contenders need: no separate venv.
        monkeypatch.setenv("TORCHBUCKET_FSSPEC_PYTHON", sys.executable)
    only = "torchbucket,gcsfs,dcp_torchbucket,dcp_fsspec"
    result = run_benchmark(
        "checkpoint", tmp_path, "--only", only, "--latency", "same-region", timeout=900
    )
    assert result["mismatched_tensors"] == 0
    assert "latency_presets" not in result  # one preset: no tail figures
    for key in (
        "save_speedup_vs_gcsfs",
        "load_speedup_vs_gcsfs",
        "dcp_save_speedup_vs_fsspec",
        "dcp_load_speedup_vs_fsspec",
        "load_peak_extra_rss_fraction",
        "dcp_load_peak_extra_rss_fraction",
    ):
        assert result[key] > 0, key
    assert result["fsspec_env"] == {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    assert result["fsspec_versions"]["gcsfs"]


def test_checkpoint_smoke_reports_the_tails_cost(tmp_path: Path) -> None:
    # Issue 19: both latency presets by default, save and load timed under each.
    result = run_benchmark("checkpoint", tmp_path, "--only", "torchbucket,floor")
    assert result["mismatched_tensors"] == 0
    assert result["latency_presets"] == ["same-region", "same-region-tail"]
    for op in ("save", "load"):
        assert result[f"tail_slowdown_{op}_torchbucket"] > 0
        # Issue 45: the floor (no torch) and what torchbucket costs beside it.
        assert result[f"{op}_fraction_of_floor"] > 0
        assert result[f"{op}_cpu_s_per_gib"] > 0 and result[f"floor_{op}_cpu_s_per_gib"] > 0
    assert "large_mib" not in result  # --smoke: no large state dict


def test_listing_timeline_smoke_compares_with_a_commit(tmp_path: Path) -> None:
    result = run_benchmark("listing_timeline", tmp_path, "--against", "HEAD")
    for side in ("head", "base"):
        for shape in ("sequential", "hashed"):
            assert result[f"idle_s_{side}_{shape}"] > 0
            assert result[f"wall_over_cpu_{side}_{shape}"] > 1
            assert result[f"requests_{side}_{shape}"] >= 5  # 5,000 names, 1,000 a page
            assert result[f"server_cpu_s_{side}_{shape}"] > 0
            # A second round went out on the first page's answer; its wait is
            # part of the listing's idle, and a floor of wall over CPU above 1.
            floor = result[f"idle_floor_s_{side}_{shape}"]
            assert 0 < floor <= result[f"idle_s_{side}_{shape}"] + 0.05
            # (One repeat in --smoke: the medians are that repeat's figures.)
            over = result[f"idle_over_floor_s_{side}_{shape}"]
            assert over == pytest.approx(result[f"idle_s_{side}_{shape}"] - floor)
            assert result[f"wall_over_cpu_floor_{side}_{shape}"] > 1
    assert "idle_saved_s_hashed" in result


@pytest.mark.parametrize("reuse", [False, True], ids=["bytes", "tensor-reuse"])
def test_soak_smoke_checks_every_byte_under_the_cap(tmp_path: Path, reuse: bool) -> None:
    result = run_benchmark("soak", tmp_path, *(["--reuse"] if reuse else []))
    assert result["output"] == ("tensor_reuse" if reuse else "bytes")
    assert result["bytes_checked"] > 0
    assert result["bytes_mismatched"] == 0
    assert result["objects_missing"] == 0 and result["objects_duplicated"] == 0
    assert result["status_429"] > 0  # the cap was met, and retried through


def test_sizes_smoke_reports_every_size_key(tmp_path: Path) -> None:
    # Issue 43: the defaults against the bare loop at every size, both presets.
    result = run_benchmark("sizes", tmp_path, "--only", "map_default,iter_default,aiohttp")
    assert result["bytes_verified"] is True
    assert set(result["sizes"]) == {"512b", "64kib", "4mib"}
    for size in result["sizes"]:
        assert result[f"default_fraction_of_limit_{size}"] > 0
        assert result[f"client_cpu_ms_per_mib_{size}"] > 0
        assert result[f"tail_slowdown_map_{size}"] > 0
        assert result[f"tail_slowdown_iterable_{size}"] > 0
        # One repeat in --smoke: one pair of back-to-back runs per default.
        for name in ("map", "iterable"):
            pairs = result[f"tail_pairs_{name}_{size}"]
            assert len(pairs) == result["repeats"] == 1 and pairs[0] > 0
        for key in ("default_speedup_vs_dataflux", "default_speedup_vs_gcsfs"):
            assert f"{key}_{size}" in result  # null when those contenders were not run
    assert set(result["goals"]) == set(result["goals_failing"])


def test_scale_smoke_runs_every_contender_against_the_rate_model(tmp_path: Path) -> None:
    # Issue 41: one job of ranks x DataLoader workers per contender, side by side.
    result = run_benchmark("scale", tmp_path, "--only", "per_process,jobwide")
    for name in ("per_process", "jobwide"):
        assert 0 <= result[f"throttled_fraction_{name}"] <= 1
        assert result[f"epoch_s_{name}"] > 0
        assert 0 < result[f"fairness_{name}"] <= 1
        assert result[f"emulator_cpu_s_{name}"] > 0
    assert result["speedup_vs_per_process"] > 0


def test_scale_sim_smoke_reports_both_controllers(tmp_path: Path) -> None:
    result = run_benchmark("scale_sim", tmp_path)
    for nodes in (8, 64):
        for key in ("throttled_fraction", "capacity_fraction", "fairness"):
            assert f"sim_{key}_{nodes}" in result
            assert f"sim_{key}_per_process_{nodes}" in result
    assert result["sim_store_ops_per_s_64"] > 0


def test_zonal_smoke_compares_with_gcsfs_on_the_grpc_endpoint(tmp_path: Path) -> None:
    # Issue 42: torchbucket and gcsfs's ZonalFile side by side on the emulator's
    # zonal bucket over gRPC (this benchmark writes no JSON or figure of its own).
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "zonal.py"), "--smoke"],
        capture_output=True,
        text=True,
        env=dict(os.environ, TORCHBUCKET_BENCH_OUTPUT=str(tmp_path)),
        cwd=ROOT,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), proc.stdout[-2000:]
    result = json.loads(last[len("RESULT ") :])
    for case in ("10k", "100k", "save", "load"):
        assert result[f"speedup_vs_gcsfs_zonal_{case}"] > 0
        assert result[f"cpu_ms_per_mib_zonal_torchbucket_{case}"] > 0
        assert result[f"cpu_ms_per_mib_zonal_gcsfs_{case}"] > 0
