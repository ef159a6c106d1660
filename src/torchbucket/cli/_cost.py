"""``torchbucket cost``: what each read strategy would cost, before spending it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from torchbucket import cost, runtime
from torchbucket.cli._common import (
    EXIT_NOT_FOUND,
    CommandError,
    human_bytes,
    open_target,
    parse_size,
    plural,
    positive_int,
)
from torchbucket.cli._ls import list_target
from torchbucket.runtime import accounting
from torchbucket.storage import SupportsSoftDelete

__all__ = ["add_cost"]


def _soft_delete(args: argparse.Namespace) -> tuple[int | None, str]:
    if args.soft_delete_days is not None:
        return round(args.soft_delete_days * 86400), "as given"
    if not args.uri.startswith("gs://"):
        return 0, "not a GCS bucket"
    target = open_target(args.uri, args.endpoint)
    store = target.store
    try:
        seconds = (
            runtime.run(store.soft_delete_retention())
            if isinstance(store, SupportsSoftDelete)
            else 0
        )
    finally:
        runtime.run(target.store.close())
    return seconds, "read from the bucket" if seconds is not None else "unknown (HTTP 403)"


def _list(args: argparse.Namespace, target: Any) -> list[Any]:
    """The objects: from the listing cache when it holds this listing, else listed."""
    if args.cache is None:
        return list_target(target)[0]
    from torchbucket.listing import ListingConfig, alist_objects

    # As the training job would: a manifest of this prefix is read instead of
    # listing; a missing or other one is listed and (re)written there.
    config = ListingConfig(cache=args.cache, cache_max_age=args.cache_max_age, progress=False)
    try:
        return runtime.run(alist_objects(target.store, target.key, config=config))
    finally:
        runtime.run(target.store.close())


def _run(args: argparse.Namespace) -> int:
    target = open_target(args.uri, args.endpoint)
    with accounting.measure() as listing:
        objects = _list(args, target)
    if not objects:
        raise CommandError(f"no objects match {target.uri}", exit_code=EXIT_NOT_FOUND)
    retention, how = _soft_delete(args)
    sizes = [o.size for o in objects]
    compose = None
    if args.compose_cap is not None:
        from torchbucket.compose import ComposeConfig

        compose = (
            ComposeConfig(max_composite_object_size=args.compose_cap)
            if args.compose_cap > 0
            else ComposeConfig(enabled=False)
        )
    plans = cost.plan_strategies(
        sizes,
        epochs=args.epochs,
        ranks=args.ranks,
        workers=args.workers,
        prices=cost.prices_for(args.location_type, args.storage_class),
        soft_delete_seconds=retention,
        compose=compose,
        # 0 when the listing came from the cache: so will the job's.
        listing_requests=listing.stats.by_op.get("list", 0),
    )
    if args.json:
        print(json.dumps(_as_json(args, sizes, retention, plans), indent=2))
        return 0
    days = "off" if not retention else f"{retention / 86400:g} days"
    print(
        f"{target.uri}: {plural(len(sizes), 'object')}, {human_bytes(sum(sizes))}; "
        f"{args.epochs} epoch(s) x {args.ranks} rank(s) x {max(args.workers, 1)} worker(s); "
        f"{args.location_type} {args.storage_class}; soft delete {days} ({how})"
    )
    if args.cache is not None:
        cached = "list" not in listing.stats.by_op
        print(f"listing {'read from' if cached else 'written to'} the cache {args.cache}")
    print(f"list prices of {cost.PRICES_DATE} from {cost.PRICES_SOURCE} (USD)")
    print(
        f"{'strategy':<9} {'A/epoch':>10} {'B/epoch':>10} {'$/epoch':>10} "
        f"{'A/run':>10} {'B/run':>12} {'$/run':>10}"
    )
    for p in plans:
        if not p.per_epoch.requests:
            print(f"{p.strategy:<9} {'-':>10} {'-':>10} {'-':>10} {'-':>10} {'-':>12} {'-':>10}")
        else:
            print(
                f"{p.strategy:<9} {p.per_epoch.class_a:>10,} {p.per_epoch.class_b:>10,} "
                f"{p.epoch.total_usd:>10.4f} {p.run.class_a:>10,} {p.run.class_b:>12,} "
                f"{p.run.total_usd:>10.4f}"
            )
    for p in plans:
        extra = ""
        if p.run.retained_bytes:
            extra = (
                f"; {human_bytes(p.run.retained_bytes)} of deleted composites billed "
                f"{p.run.retained_days:g} days (${p.run.retained_storage_usd:.4f})"
            )
        print(f"  {p.strategy}: {p.note}{extra}")
    return 0


def _as_json(
    args: argparse.Namespace, sizes: list[int], retention: int | None, plans: list[Any]
) -> dict[str, Any]:
    return {
        "uri": args.uri,
        "objects": len(sizes),
        "bytes": sum(sizes),
        "epochs": args.epochs,
        "ranks": args.ranks,
        "workers": args.workers,
        "soft_delete_seconds": retention,
        "prices": {"source": cost.PRICES_SOURCE, "date": cost.PRICES_DATE},
        "strategies": [
            {
                "strategy": p.strategy,
                "per_epoch": p.per_epoch.to_dict(),
                "once": p.once.to_dict(),
                "epoch_usd": p.epoch.total_usd,
                "run_usd": p.run.total_usd,
                "retained_bytes_run": p.run.retained_bytes,
                "note": p.note,
            }
            for p in plans
        ],
    }


def add_cost(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    parser = sub.add_parser(
        "cost",
        parents=[common],
        help="estimate the requests and cost of each read strategy for a training run",
        description=(
            "List the objects under URI and model, for each read strategy (direct reads, "
            "compose, packed shards), the GCS requests of one epoch and of the whole run "
            "(listing and packing included) and their cost at list prices, with deleted "
            "composites billed for the bucket's soft-delete retention (read from the "
            "bucket: one request). Nothing is read but the listing and the bucket's policy."
        ),
        epilog="example:\n  torchbucket cost gs://my-bucket/train/ --epochs 90 --ranks 8 --workers 4",
    )
    parser.add_argument("uri", metavar="URI", help="gs://bucket/prefix (or memory://, file:///)")
    parser.add_argument("--epochs", type=positive_int, default=1, help="epochs (default: 1)")
    parser.add_argument("--ranks", type=positive_int, default=1, help="DDP ranks (default: 1)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="DataLoader workers per rank (default: 1; 0 counts as the main process)",
    )
    parser.add_argument(
        "--location-type",
        choices=["region", "multi-region"],
        default="region",
        help="the bucket's location type, for prices (default: region)",
    )
    parser.add_argument(
        "--storage-class",
        choices=["STANDARD", "NEARLINE", "COLDLINE", "ARCHIVE"],
        default="STANDARD",
        help="the objects' storage class, for prices (default: STANDARD)",
    )
    parser.add_argument(
        "--soft-delete-days",
        type=float,
        default=None,
        help="the bucket's soft-delete retention in days, instead of reading it",
    )
    parser.add_argument(
        "--compose-cap",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="ComposeConfig.max_composite_object_size, 0 for compose off "
        "(default: ComposeConfig's)",
    )
    parser.add_argument(
        "--cache",
        metavar="LOCATION",
        default=None,
        help="the job's listing cache (ListingConfig.cache: a path or an object URI): read "
        "instead of listing when it holds this prefix's listing, else listed and written there",
    )
    parser.add_argument(
        "--cache-max-age",
        type=float,
        default=None,
        metavar="SECONDS",
        help="ListingConfig.cache_max_age: list again when the cache is older (default: no limit)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=_run)
