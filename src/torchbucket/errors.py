"""The one exception tree of torchbucket.

Every error raised by torchbucket derives from :class:`TorchBucketError`. Where a
builtin exception already means the same thing, the torchbucket error also derives
from it, so code that catches ``FileNotFoundError`` or ``PermissionError`` keeps
working::

    TorchBucketError
    ├── InvalidURIError            (also ValueError)   malformed gs://, file://, memory:// URI
    ├── ConfigError                (also ValueError)   a bad option value
    └── StorageError                                   an operation on a store failed
        ├── NotFoundError          (also FileNotFoundError)  object or bucket missing (404)
        │   └── BucketNotFoundError
        ├── BucketExistsError      (also FileExistsError)    creating a bucket that exists (409)
        ├── PermissionDeniedError  (also PermissionError)    401 / 403
        ├── PreconditionFailedError                    412: a generation did not match
        ├── IntegrityError                             checksum or size mismatch (reads retry
        │                                              it; raised when it persists)
        ├── CheckpointError                            a checkpoint that cannot be loaded as it
        │                                              is: corrupt, not a checkpoint, refused
        │                                              as unsafe, or changed since its save
        ├── RetryableError                             worth another attempt
        │   ├── ThrottledError                         429 (and 503 "slow down")
        │   └── TransientError                         408, 500, 502, 504, reset, timeout,
        │       │                                      truncated body
        │       └── UnreachableError                   a local endpoint (an emulator) refused
        │                                              the connection: retried for seconds only
        └── DeadlineExceededError  (also TimeoutError) retries ran past the deadline

Any other status (400, 405, 409, 501, ...) is a plain :class:`StorageError`,
never retried; the GCS backend's one status table is
``torchbucket.storage.gcs._errors.STATUS_ERRORS`` (Google's retry strategy,
https://cloud.google.com/storage/docs/retry-strategy).

Backends translate vendor errors (HTTP statuses, ``OSError``) into this tree in one
place each and re-raise ``from`` the original. Every :class:`StorageError` carries
the operation (``"get"``, ``"list"``, ...) and the URI it was about, and both appear
in its message. Retry decisions are made on the type, never on the message text.

One message format: ``"<operation> <uri>: <message> (HTTP <status>)"``, each part
once (the status only when there was one). An error that quotes another about
the same operation quotes its ``message``, never its ``str()``.
"""

from __future__ import annotations

__all__ = [
    "BucketExistsError",
    "BucketNotFoundError",
    "CheckpointError",
    "ConfigError",
    "DeadlineExceededError",
    "IntegrityError",
    "InvalidURIError",
    "NotFoundError",
    "PermissionDeniedError",
    "PreconditionFailedError",
    "RetryableError",
    "StorageError",
    "ThrottledError",
    "TorchBucketError",
    "TransientError",
    "UnreachableError",
]


class TorchBucketError(Exception):
    """Root of every error torchbucket raises."""


class InvalidURIError(TorchBucketError, ValueError):
    """A URI could not be parsed, or names an unsupported scheme."""


class ConfigError(TorchBucketError, ValueError):
    """A configuration value is out of range or inconsistent."""


class StorageError(TorchBucketError):
    """An operation on an object store failed.

    Args:
        message: What went wrong, in words.
        operation: The store operation, for example ``"get"`` or ``"compose"``.
        uri: The object, prefix or bucket URI the operation was about.
        status: The HTTP status, when there was one.
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str = "",
        uri: str = "",
        status: int | None = None,
    ) -> None:
        self.message = message
        self.operation = operation
        self.uri = uri
        self.status = status
        super().__init__(message)

    def __str__(self) -> str:
        where = " ".join(part for part in (self.operation, self.uri) if part)
        status = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{where}: {self.message}{status}" if where else f"{self.message}{status}"

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments do not survive the default exception pickling,
        # and errors cross process boundaries (DataLoader workers, torchrun).
        return (_rebuild, (type(self), self.message, self.operation, self.uri, self.status))


def _rebuild(
    cls: type[StorageError], message: str, operation: str, uri: str, status: int | None
) -> StorageError:
    return cls(message, operation=operation, uri=uri, status=status)


class NotFoundError(StorageError, FileNotFoundError):
    """The object (or bucket) does not exist."""


class BucketNotFoundError(NotFoundError):
    """The bucket itself does not exist."""


class BucketExistsError(StorageError, FileExistsError):
    """A bucket to create exists already (HTTP 409), yours or someone else's."""


class PermissionDeniedError(StorageError, PermissionError):
    """The credentials may not perform the operation (HTTP 401 or 403)."""


class PreconditionFailedError(StorageError):
    """A generation precondition did not hold (HTTP 412)."""


class IntegrityError(StorageError):
    """The bytes received do not match the object's checksum or size."""


class CheckpointError(StorageError):
    """A checkpoint cannot be loaded as it is.

    Its bytes are not a checkpoint (random, truncated, another format), it
    names code that loading would run, or its files changed since it was
    saved. The message names the object; retrying does not help.
    """


class RetryableError(StorageError):
    """A failure that another attempt may not meet."""


class ThrottledError(RetryableError):
    """The service asked the client to slow down (HTTP 429, or 503).

    Attributes:
        retry_after: Seconds the server asked to wait, if it said.
    """

    retry_after: float | None = None


class TransientError(RetryableError):
    """A server error, a reset connection, a timeout or a truncated body."""


class UnreachableError(TransientError):
    """A local endpoint refused the connection, or its name did not resolve.

    A local endpoint is one on this machine (``localhost``, a loopback address)
    or the host of ``$STORAGE_EMULATOR_HOST``: an emulator that is not running,
    or an address left over from one that was restarted on another port. It is
    retried for a few seconds (an emulator may be starting), not until the
    retry deadline; the message names the endpoint. The same failure on
    Google's endpoint is a plain :class:`TransientError`.
    """


class DeadlineExceededError(StorageError, TimeoutError):
    """Retries did not succeed before the retry deadline."""
