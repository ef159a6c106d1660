"""Listing every object under a prefix: in parallel, once per job, in order.

The user API::

    from torchbucket.listing import ListingConfig, list_objects

    objects = list_objects("gs://my-bucket/train/")
    objects = await alist_objects(store, "train/", config=ListingConfig(cache="train.json.gz"))

Inside: :mod:`._listing` (the calls, filters, progress), :mod:`._lister` (the
parallel lister's requests and scheduling) and :mod:`._ranges` (its key ranges
and cuts) over :mod:`._keyspace` (names as numbers), :mod:`._broadcast` (rank 0
lists for the job) and :mod:`._manifest` (the listing cache), both storing the
listing as :mod:`._columns`.
"""

from torchbucket.listing._listing import ProgressBar, alist_objects, list_objects
from torchbucket.listing._ranges import ListingStats
from torchbucket.listing.config import ListingConfig

__all__ = ["ListingConfig", "ListingStats", "ProgressBar", "alist_objects", "list_objects"]
