"""A zonal pointer is followed only to a data object of its own key (storage/gcs/_pointers.py)."""

from __future__ import annotations

import pytest

from torchbucket.storage.gcs._pointers import (
    CRC,
    GENERATION,
    POINTER_PREFIX,
    SIZE,
    TARGET,
    data_name,
    pointed,
)


def _meta(target: str) -> dict[str, str]:
    return {TARGET: target, GENERATION: "7", SIZE: "10", CRC: "AAAAAA=="}


@pytest.mark.parametrize("key", ["ckpt.pt", "run/a b/ünï.pt", "deep/" + "x" * 1010])
def test_a_pointer_to_a_data_object_of_its_key_is_followed(key: str) -> None:
    target = data_name(key)
    assert pointed(_meta(target), key) == (target, 7, 10, "AAAAAA==")


def test_metadata_naming_any_other_object_is_not_a_pointer() -> None:
    # Anyone who may write the bucket may set metadata: it must not send a
    # read of one name to another writer's object, nor have a replace or a
    # delete of this name delete that object.
    key = "run/ckpt.pt"
    others = [
        "other-run/ckpt.pt",
        "../x",
        f"x/{POINTER_PREFIX}y",
        "",
        "0123456789abcdef",
        data_name("run/other.pt"),  # another key's data object
        data_name("run/ckpt.pt/x"),  # a data object of a key under this one
        data_name("deep/" + "x" * 1010),  # another key's hashed data object
        f"{POINTER_PREFIX}{key}/0123456789abcdef/more",
        f"{POINTER_PREFIX}{key}/0123456789ABCDEF",
        f"{POINTER_PREFIX}{key}/0123",
    ]
    for target in others:
        assert pointed(_meta(target), key) is None, target
