"""tests/bucket_kinds.py names only modules and tests that exist, so no exclusion goes stale."""

from __future__ import annotations

import re
from pathlib import Path

import bucket_kinds

TESTS = Path(__file__).resolve().parent.parent


def test_every_module_listed_exists_and_is_listed_once() -> None:
    listed = [*bucket_kinds.BOTH_KINDS, *bucket_kinds.NOT_YET]
    assert len(set(listed)) == len(listed)
    assert [m for m in listed if not (TESTS / m).is_file()] == []


def test_every_regional_only_entry_names_a_test_of_a_listed_module() -> None:
    stale = []
    for entry, reason in bucket_kinds.REGIONAL_ONLY.items():
        module, _, name = entry.partition("::")
        source = (TESTS / module).read_text() if (TESTS / module).is_file() else ""
        defined = not name or re.search(rf"^def {re.escape(name)}\(", source, re.MULTILINE)
        if module not in bucket_kinds.BOTH_KINDS or not reason.strip() or not defined:
            stale.append(entry)
    assert stale == []


def test_kinds_for_a_listed_an_excluded_and_an_unlisted_test() -> None:
    module = "integration/test_checkpoint_emulator.py"
    both = bucket_kinds.kinds_for(f"tests/{module}::test_round_trip_over_http", ["emulator"])
    assert both == ["regional", "zonal"]
    excluded = f"tests/{module}::test_transient_part_failures_are_retried"
    assert bucket_kinds.kinds_for(excluded, ["emulator"]) == ["regional"]
    assert bucket_kinds.kinds_for("tests/integration/test_cli_emulator.py::t", ["emulator"]) is None
    assert bucket_kinds.kinds_for(f"tests/{module}::test_x", ["tmp_path"]) is None
