"""What to try next, added to the one-line error of a failed command."""

from __future__ import annotations

from torchbucket._uri import parse_uri
from torchbucket.errors import BucketNotFoundError, InvalidURIError

__all__ = ["hint_for"]


def hint_for(exc: BaseException) -> str:
    """A suffix for the error line (``""`` when there is nothing to add)."""
    if isinstance(exc, BucketNotFoundError) and exc.uri.startswith("gs://"):
        try:
            bucket = parse_uri(exc.uri).bucket
        except InvalidURIError:
            return ""
        return f"; to create it: torchbucket mb gs://{bucket}"
    return ""
