"""A zonal pointer is followed only to a hidden data object (storage/gcs/_pointers.py)."""

from __future__ import annotations

from torchbucket.storage.gcs._pointers import CRC, GENERATION, POINTER_PREFIX, SIZE, TARGET, pointed


def _meta(target: str) -> dict[str, str]:
    return {TARGET: target, GENERATION: "7", SIZE: "10", CRC: "AAAAAA=="}


def test_a_pointer_to_a_hidden_data_object_is_followed() -> None:
    target = f"{POINTER_PREFIX}ckpt.pt/0123456789abcdef"
    assert pointed(_meta(target)) == (target, 7, 10, "AAAAAA==")


def test_metadata_naming_any_other_object_is_not_a_pointer() -> None:
    # Anyone who may write the bucket may set metadata: it must not send a
    # read of one name to another writer's object.
    for target in ("other-run/ckpt.pt", "../x", f"x/{POINTER_PREFIX}y", ""):
        assert pointed(_meta(target)) is None
