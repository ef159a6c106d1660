"""An empty object that a window's composes name as their first source, so that they can be revoked.

Why: a compose path read around (its group read directly because the compose
straggled) is left running, and an epoch that ends by deleting its composites
had to wait for its compose's answer. Until then the compose may still make
its composite: a request held before the server applied it takes effect when
it is applied, whatever the client has given up on since
(https://cloud.google.com/storage/docs/retry-strategy treats a write whose
answer never came as possibly applied). Under the emulator's
``same-region-tail`` preset (1 request in 1,000 held 2 s, half of them before
they are applied) that wait held a quarter to two thirds of the 10 KiB epochs
of 20,000 objects for up to 2 s (``benchmarks/tail_epochs.py``).

How: every compose of a prefetch window names the anchor, pinned to its
generation, as its first source (it is empty: the composite's bytes and
checksum are the group's). Deleting the anchor revokes every compose of the
window not yet applied: applied afterwards, it fails, its source gone (a
compose is performed only if each source's generation matches its
``ifGenerationMatch``: https://cloud.google.com/storage/docs/json_api/v1/objects/compose).
A compose applied before the anchor's delete answered is visible to a
``HEAD`` sent after it, GCS being strongly consistent
(https://cloud.google.com/storage/docs/consistency); so once the anchor is
gone, a compose path still unanswered either made its composite, which is
found and deleted by generation, or never will, and the epoch need not wait
for it. The cost: the anchor's upload (one class A request per window and
bucket, that is per DataLoader worker and epoch) and its delete (free), and
groups of ``max_sources - 1`` objects.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from torchbucket.compose._tuning import TUNING
from torchbucket.compose.config import ComposeConfig
from torchbucket.compose.registry import delete_composite, register
from torchbucket.errors import StorageError
from torchbucket.storage.base import ObjectInfo, ObjectStore

__all__ = ["Anchor", "window_anchored"]

logger = logging.getLogger(__name__)


class Anchor:
    """One window's anchor on one bucket (used from the runtime's loop only).

    Created on first use; revoked (deleted) once, by whichever comes first:
    the window's end, or an epoch's drain settling a compose path that named
    it.

    Args:
        store: The bucket the window's groups are composed in.
        config: Compose settings (the anchor lives under ``composite_prefix``,
            where ``torchbucket cleanup`` finds one a killed process left).
    """

    __slots__ = ("_config", "_created", "_revoked", "name", "store")

    def __init__(self, store: ObjectStore, config: ComposeConfig) -> None:
        self.store = store
        self._config = config
        self.name = f"{config.composite_prefix}{uuid.uuid4().hex}.anchor"
        self._created: asyncio.Task[ObjectInfo | None] | None = None
        self._revoked: asyncio.Task[bool] | None = None

    async def info(self) -> ObjectInfo | None:
        """The anchor as created, to name as a source; ``None``: compose without it.

        ``None`` once it is revoked, when it could not be created, or while
        its upload has taken ``read_around_floor`` (:mod:`._tuning`) and still
        not answered (a straggling upload does not hold the window's
        composes: they go on as they would without anchors).
        """
        if self._revoked is not None:
            return None
        created = self._created
        if created is None:
            register(self.store, self.name)  # deleted at exit if the window never ends
            created = self._created = asyncio.ensure_future(self._create())
        if not created.done():
            await asyncio.wait({created}, timeout=max(TUNING.read_around_floor, 0.05))
            if not created.done():
                return None
        return None if self._revoked is not None else created.result()

    async def _create(self) -> ObjectInfo | None:
        try:
            return await self.store.put(self.name, b"", if_generation_match=0)
        except StorageError as exc:
            logger.debug("anchor %s not created (%s)", self.store.uri(self.name), exc)
            return None

    def revoke(self) -> asyncio.Task[bool]:
        """Delete the anchor (once); the task's result: whether it is gone.

        From the moment it is gone no compose that names it can be applied.
        A revoke before the anchor was ever made is trivially true.
        """
        if self._revoked is None:
            self._revoked = asyncio.ensure_future(self._delete())
        return self._revoked

    async def _delete(self) -> bool:
        if self._created is None:
            return True
        info = await asyncio.shield(self._created)
        if info is None:
            # Not created: its upload failed, yet may have taken effect.
            return await delete_composite(self.store, self.name) is None
        error = await delete_composite(
            self.store,
            self.name,
            info.generation,
            resend_after=TUNING.read_around_after,
            resend_floor=TUNING.read_around_floor,
        )
        return error is None


def window_anchored(config: ComposeConfig) -> bool:
    """Whether a prefetch window composing with ``config`` names an :class:`Anchor`.

    It does when it composes at all, with groups of more than 2 sources (the
    anchor takes one), unless tests or benchmarks turned anchors off
    (``anchor`` in :mod:`torchbucket.compose._tuning`).
    """
    return config.enabled and TUNING.anchor and config.max_sources > 2
