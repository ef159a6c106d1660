"""Which test modules run on both bucket kinds, regional and zonal, and which of their tests do not.

Every test of a module in :data:`BOTH_KINDS` that uses the ``emulator``
fixture runs twice, ``[regional]`` (JSON and XML APIs) and ``[zonal]`` (a
zonal bucket, reads and writes over gRPC: see ``tests/conftest.py``), unless
:data:`REGIONAL_ONLY` names it with the reason: what it exercises is something
a zonal bucket does not have, and the test named in the reason checks what a
zonal bucket does instead. Nothing is skipped: an excluded test is collected
for its regional bucket only, and ``pytest``'s header counts them.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from torchbucket.emulator import Emulator
from torchbucket.storage.gcs._pointers import TARGET, hashed, pointer_key

#: Test modules (relative to ``tests/``) whose emulator tests run on both kinds.
BOTH_KINDS: tuple[str, ...] = (
    "integration/test_auth_service_account.py",
    "integration/test_batch_sampler_emulator.py",
    "integration/test_checkpoint_crash.py",
    "integration/test_checkpoint_emulator.py",
    "integration/test_checkpoint_fallback.py",
    "integration/test_checkpoint_load_errors_emulator.py",
    "integration/test_checkpoint_load_memory_emulator.py",
    "integration/test_checkpoint_long_names_emulator.py",
    "integration/test_checkpoint_mapped_emulator.py",
    "integration/test_cleanup_staged_emulator.py",
    "integration/test_compose_read_around.py",
    "integration/test_cost_vs_emulator.py",
    "integration/test_dataset_emulator.py",
    "integration/test_dataset_stats_emulator.py",
    "integration/test_dataset_torchrun.py",
    "integration/test_dcp_emulator.py",
    "integration/test_dcp_torchrun.py",
    "integration/test_hedged_reads.py",
    "integration/test_large_samples_emulator.py",
    "integration/test_lightning_emulator.py",
    "integration/test_orphaned_worker_emulator.py",
    "integration/test_read_integrity.py",
    "integration/test_shards_emulator.py",
    "integration/test_shared_bytes_emulator.py",
    "integration/test_shm_reuse_emulator.py",
    "integration/test_soft_delete_compose.py",
    "integration/test_transcoding_emulator.py",
    "integration/test_unreachable_emulator.py",
    "integration/test_upload_integrity.py",
    "integration/test_worker_exit_emulator.py",
    "reliability/test_bad_input.py",
    "reliability/test_crash.py",
    "reliability/test_fault_matrix.py",
)

_MULTIPART = (
    "XML multipart upload, which a zonal bucket does not have: a save there streams into an "
    "appendable object (test_zonal_emulator.py's checkpoint tests break and refuse that stream)"
)

#: ``module::test`` (or a whole ``module``) -> why it runs on a regional bucket only.
REGIONAL_ONLY: dict[str, str] = {
    "integration/test_checkpoint_crash.py::test_sigkill_mid_save_keeps_previous_checkpoint": (
        "waits for the child's multipart upload; the zonal kill is "
        "test_zonal_emulator.py::test_a_damaged_write_or_a_killed_save_keeps_the_previous_checkpoint"
    ),
    "integration/test_checkpoint_emulator.py::test_transient_part_failures_are_retried": _MULTIPART,
    "integration/test_checkpoint_emulator.py::test_a_refused_part_fails_the_save_and_leaves_nothing": (
        _MULTIPART
    ),
    "integration/test_checkpoint_emulator.py::test_cleanup_aborts_orphaned_uploads": (
        "incomplete multipart uploads; a zonal bucket's leftovers are orphan data objects "
        "(test_cleanup_zonal_emulator.py)"
    ),
    "integration/test_checkpoint_fallback.py": (
        "the fallback from a refused XML multipart upload; on a zonal bucket the store refuses "
        "multipart itself, without a request (test_zonal_emulator.py's checkpoint tests)"
    ),
    "integration/test_checkpoint_long_names_emulator.py::"
    "test_cleanup_finds_what_a_save_to_a_name_at_the_limit_leaves": (
        "a staged .tbtmp- object that compose would promote; zonal long names: "
        "test_cleanup_zonal_emulator.py"
    ),
    "integration/test_dataset_emulator.py::test_compose_refused_over_http_falls_back_with_one_warning": (
        "a compose the server refuses; on a zonal bucket compose is off before any request "
        "(the [zonal] epochs check that none is sent)"
    ),
    "integration/test_dataset_emulator.py::"
    "test_worker_killed_mid_epoch_leaves_composites_that_cleanup_removes": (
        "composites left by a killed worker; a zonal bucket has no compose, so none"
    ),
    "integration/test_large_samples_emulator.py::"
    "test_tensor_output_of_composed_objects_is_views_of_one_composite": (
        "views of one composite object; a zonal bucket has no compose"
    ),
    "reliability/test_bad_input.py::test_permission_denied_on_compose_falls_back_with_one_warning": (
        "a compose the server refuses; on a zonal bucket compose is off before any request "
        "(test_dataset_emulator.py's [zonal] epochs check that none is sent)"
    ),
    "reliability/test_bad_input.py::test_dataset_objects_larger_than_the_composite_cap": (
        "which objects compose coalesces; a zonal bucket has no compose"
    ),
    "reliability/test_crash.py": (
        "kills an epoch holding composites (a zonal bucket has none) and saves mid XML "
        "multipart or resumable upload; the zonal kill: test_zonal_fault_matrix_emulator.py::"
        "test_a_save_killed_after_a_flush_keeps_the_previous_checkpoint"
    ),
    "reliability/test_fault_matrix.py::test_fault": (
        "compose, composite deletes and the JSON and XML uploads, which a zonal bucket does not "
        "have (its saves stream over gRPC: test_zonal_fault_matrix_emulator.py::"
        "test_a_faulted_save_keeps_the_previous_checkpoint), and the listing, the same JSON API "
        "request on both kinds; the zonal reads: test_read_fault[zonal-*]"
    ),
    "integration/test_auth_service_account.py": (
        "google-auth's tokens end to end, on emulators of its own with auth on; its zonal case "
        "is test_a_zonal_checkpoint_over_grpc_carries_fresh_tokens (gRPC metadata)"
    ),
    "integration/test_cleanup_staged_emulator.py": (
        "staged .tbtmp- objects of multipart saves; a zonal save's leftovers are orphan data "
        "objects (test_cleanup_zonal_emulator.py)"
    ),
    "integration/test_compose_read_around.py": (
        "reading around a straggling compose; a zonal bucket has no compose"
    ),
    "integration/test_cost_vs_emulator.py": (
        "the cost plans of compose and direct strategies over the JSON API's request classes; a "
        "zonal epoch's gRPC streams are counted by test_dataset_stats_emulator.py's [zonal] cases"
    ),
    "integration/test_soft_delete_compose.py": (
        "compose under soft delete; a zonal bucket has no compose"
    ),
    "integration/test_transcoding_emulator.py::test_the_emulator_transcodes_as_gcs_documents": (
        "the JSON API's transcoding, asked of the emulator's HTTP side; a zonal bucket's reads "
        "take gRPC, which GCS does not transcode: test_transcoding_emulator.py::"
        "test_grpc_serves_the_stored_bytes_as_gcs_does, and its [zonal] cases read them decoded"
    ),
    "integration/test_transcoding_emulator.py::test_compose_of_gzip_objects_is_what_gcs_composes": (
        "compose; a zonal bucket has none"
    ),
    "integration/test_unreachable_emulator.py": (
        "an endpoint that refuses connections: no bucket answers, so none is zonal (the JSON "
        "request that asks a bucket's kind is the one refused)"
    ),
    "integration/test_upload_integrity.py": (
        "the emulator's checks of the JSON and XML uploads' declared checksums; a zonal write's "
        "checks: test_emulator_grpc_faults.py and the zonal fault matrix"
    ),
}

#: Modules of the issue's list not yet run on zonal buckets, and why.
NOT_YET: dict[str, str] = {}


def kinds_for(nodeid: str, fixturenames: Sequence[str]) -> list[str] | None:
    """The ``bucket_kind`` values for test ``nodeid``; ``None``: not parametrized."""
    if "emulator" not in fixturenames:
        return None
    path, _, name = nodeid.partition("::")
    module = path.removeprefix("tests/")
    if module not in BOTH_KINDS:
        return None
    if module in REGIONAL_ONLY or f"{module}::{name}" in REGIONAL_ONLY:
        return ["regional"]
    return ["regional", "zonal"]


def header() -> str:
    """The line ``pytest`` prints at the top of a run."""
    return (
        f"bucket kinds: {len(BOTH_KINDS)} modules run on regional and zonal buckets, "
        f"{len(REGIONAL_ONLY)} of their tests (or modules) on regional ones only, "
        f"{len(NOT_YET)} modules not yet (tests/bucket_kinds.py)"
    )


class ZonalBuckets:
    """An :class:`Emulator` (started with ``grpc=True``) whose new buckets are zonal.

    Everything else is the emulator's own: names, stats, faults, seeding.
    """

    def __init__(self, emu: Emulator) -> None:
        self._emu = emu

    def create_bucket(self, name: str, **kwargs: Any) -> None:
        """Create zonal bucket ``name`` (``Emulator.create_bucket`` with ``zonal=True``)."""
        kwargs.setdefault("zonal", True)
        self._emu.create_bucket(name, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._emu, name)

    def __repr__(self) -> str:
        return f"ZonalBuckets({self._emu!r})"


def stored_names(emu: Emulator | ZonalBuckets, bucket: str, prefix: str = "") -> list[str]:
    """``emu.object_names(bucket, prefix)``, a zonal bucket's pointers counted once.

    On a zonal bucket a large write is a pointer under its name and a data
    object under ``torchbucket-zonal-objects/`` (``storage/gcs/_zonal.py``).
    A data object that a pointer listed here names is folded into it; any
    other (an orphan, a half-written save) stays in the answer, so a test that
    expects nothing left still sees it.
    """
    if not isinstance(emu, ZonalBuckets):
        return emu.object_names(bucket, prefix)
    docs = _listing(emu, bucket)
    named = {(d.get("metadata") or {}).get(TARGET) for d in docs}

    def under(name: str) -> bool:
        if name.startswith(prefix):
            return True
        key = pointer_key(name)
        return hashed(name) or (key is not None and key.startswith(prefix))

    return sorted(d["name"] for d in docs if d["name"] not in named and under(d["name"]))


def _listing(emu: ZonalBuckets, bucket: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    token = ""
    while True:
        query = urllib.parse.urlencode(
            {"fields": "items(name,metadata),nextPageToken", "pageToken": token}
        )
        url = f"{emu.endpoint}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?{query}"
        with urllib.request.urlopen(url, timeout=30) as answer:
            page = json.loads(answer.read())
        docs += page.get("items", [])
        token = page.get("nextPageToken") or ""
        if not token:
            return docs
