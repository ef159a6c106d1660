"""``benchmarks/sizes.py --decode``: the sweep with a real JPEG decode in ``data_format_fn``.

At each size, JPEG images of about that many bytes are made at setup
(:func:`jpegs`: a few variants of a smooth random picture with some grain,
sized by a few encodes, quality 90) and stored as the objects; every
contender decodes each in its DataLoader workers (``_contenders/decode_loader.py``)
with the same Pillow build, the project's ``.venv``'s, put on ``PYTHONPATH``
for the dataflux and gcsfs venvs (:func:`pillow_path`). The contenders:
torchbucket's two defaults with ``data_format_fn=decode``, dataflux's best
(map-style, compose, 8 threads), gcsfs's batched ``cat``, and the bare
aiohttp loop in the same DataLoader workers (``aiohttp_dataloader.py``'s
prototype) decoding the same way: the limit here, as decoding happens in the
workers for everyone. Constant latency preset only.

RESULT keys per size: ``decode_default_fraction_of_loop_<size>`` (the lower
of the two defaults over the loop), ``decode_speedup_vs_dataflux_<size>``,
``decode_speedup_vs_gcsfs_<size>``, ``decode_client_cpu_ms_per_mib_<size>``
(the higher default's, per MiB of JPEG read), ``decode_megapixels_<size>``
and ``decode_samples_per_s_<key>_<size>``.
"""

from __future__ import annotations

import io
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import _harness as h
import dataloading as dl

KIB = 1 << 10
MIB = 1 << 20
#: (key, target bytes, objects in --quick).
#: Half the counts of the first run (2026-12-05: 14.6 minutes at load 5-9,
#: as the decode holds both cores): epochs of 3-10 s.
DECODE_SIZES = [
    ("16kib", 16 * KIB, 1000),
    ("256kib", 256 * KIB, 300),
    ("1mib", MIB, 120),
    ("4mib", 4 * MIB, 32),
]
DECODE_SMOKE = [("16kib", 16 * KIB, 64), ("1mib", MIB, 16)]
VARIANTS = 4
#: key, label, kind, venv ("tb", "dataflux", "gcsfs"), style.
CONTENDERS = [
    ("map_default", "torchbucket map + BucketBatchSampler, defaults", "tb_map", "tb"),
    ("iter_default", "torchbucket iterable, defaults", "tb_iter", "tb"),
    ("df_best", "dataflux map, compose, 8 threads", "dataflux", "dataflux"),
    ("gcsfs_cat", "gcsfs, batched fs.cat", "gcsfs", "gcsfs"),
    ("loop", "bare aiohttp loop in DataLoader workers", "loop", "tb"),
]


def _picture(side_w: int, side_h: int, seed: int) -> Any:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    small = rng.integers(
        0, 256, size=(max(2, side_h // 32), max(2, side_w // 32), 3), dtype=np.uint8
    )
    smooth = np.asarray(
        Image.fromarray(small).resize((side_w, side_h), Image.BICUBIC), dtype=np.int16
    )
    grain = rng.integers(-12, 13, size=smooth.shape, dtype=np.int16)
    return Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8))


def _encode(image: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


def jpegs(target: int, variants: int = VARIANTS) -> list[tuple[bytes, int, tuple[int, int]]]:
    """``variants`` JPEGs of about ``target`` bytes: (data, decoded CRC32C, (width, height))."""
    import numpy as np
    from PIL import Image

    from _contenders._common import crc32c

    side = max(16, int(math.sqrt(target / 0.6)))  # first guess: ~0.6 bytes per pixel
    for _ in range(5):
        w, h_ = side * 4 // 3, side
        size = len(_encode(_picture(w, h_, 0)))
        if abs(size - target) < 0.05 * target:
            break
        side = max(16, int(side * math.sqrt(target / size)))
    out = []
    for v in range(variants):
        data = _encode(_picture(side * 4 // 3, side, v))
        with Image.open(io.BytesIO(data)) as image:
            pixels = np.asarray(image.convert("RGB"))
        out.append((data, crc32c(pixels.reshape(-1)), (pixels.shape[1], pixels.shape[0])))
    return out


def pillow_path() -> str:
    """A directory holding only links to this venv's Pillow, for the other venvs' PYTHONPATH."""
    import PIL

    site = Path(PIL.__file__).resolve().parent.parent
    shim = Path(tempfile.gettempdir()) / f"tb-bench-pillow-{os.getpid()}"
    shim.mkdir(exist_ok=True)
    for name in ("PIL", "pillow.libs"):
        link = shim / name
        if (site / name).exists() and not link.exists():
            link.symlink_to(site / name)
    return str(shim)


def run_size(
    key: str, target: int, count: int, args: Any, bench_py: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One size: every contender (``args.only``'s) ``args.repeats`` times (once in
    ``--smoke``); the RESULT keys and the medians per contender."""
    repeats = 1 if args.smoke else args.repeats
    only = args.only.split(",") if args.only else None
    images = jpegs(target)
    mean_bytes = sum(len(d) for d, _, _ in images) / len(images)
    bucket = f"dec-{key}"
    names = dl_names(count)
    shim = pillow_path()
    runs: dict[str, list[dict[str, Any]]] = {}
    batch = max(1, min(dl.BATCH_SIZE, (64 * MIB) // target))
    with h.emulator(latency="same-region") as emu:
        emu.create_bucket(bucket)
        emu.seed(bucket, ((n, images[i % len(images)][0]) for i, n in enumerate(names)))
        for rep in range(repeats):
            for c_key, _label, kind, venv in CONTENDERS:
                if only is not None and c_key not in only:
                    continue
                if venv == "dataflux" and bench_py is None:
                    continue
                if venv == "gcsfs" and h.fsspec_python() is None:
                    continue
                spec = {
                    "endpoint": emu.endpoint,
                    "bucket": bucket,
                    "prefix": dl.PREFIX,
                    "count": count,
                    "variants": [crc for _, crc, _ in images],
                    "kind": kind,
                    "batch_size": batch,
                    "num_workers": dl.NUM_WORKERS,
                    "prefetch": dl.limit_concurrency() // dl.NUM_WORKERS,
                    "pid_file": str(
                        Path(tempfile.gettempdir()) / f"tb-bench-{os.getpid()}-dec.pids"
                    ),
                }
                env = {"STORAGE_EMULATOR_HOST": emu.endpoint}
                python = None
                if venv == "dataflux":
                    python, env["PYTHONPATH"] = bench_py, shim
                elif venv == "gcsfs":
                    python, env["PYTHONPATH"] = h.fsspec_python(), shim
                    env.update(dl.FSSPEC_ENV)
                print(
                    f"  decode {key} {c_key} run {rep + 1} ...", end="", file=sys.stderr, flush=True
                )
                try:
                    run = h.run_contender(
                        f"dec-{key}-{c_key}-{rep}",
                        "decode_loader.py",
                        spec,
                        python=python,
                        env=env,
                        timeout=args.timeout,
                    )
                except h.ContenderError as exc:
                    print(f" failed: {str(exc)[:300]}", file=sys.stderr, flush=True)
                    continue
                d = run.data
                r = {
                    "samples_per_s": d["objects"] / d["wall_s"],
                    "client_cpu_ms_per_obj": d["cpu_s"] / d["objects"] * 1e3,
                    "first_batch_s": d.get("first_batch_s", math.nan),
                    "server_cpu_s": d["server"]["cpu_s"],
                    "wall_s": d["wall_s"],
                }
                runs.setdefault(c_key, []).append(r)
                print(f" {r['samples_per_s']:,.1f} samples/s", file=sys.stderr, flush=True)
    med = {
        k: {f: _median([r[f] for r in v]) for f in v[0]} | {"repeats": len(v)}
        for k, v in runs.items()
    }
    return _figures(key, med, mean_bytes, images[0][2]), med


def dl_names(count: int) -> list[str]:
    from _contenders._common import generated_names

    return generated_names(dl.PREFIX, count)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _figures(
    key: str, med: dict[str, Any], mean_bytes: float, shape: tuple[int, int]
) -> dict[str, Any]:
    def rate(k: str) -> float:
        return float((med.get(k) or {}).get("samples_per_s", math.nan))

    out: dict[str, Any] = {}
    for c_key, *_ in CONTENDERS:
        if not math.isnan(rate(c_key)):
            out[f"decode_samples_per_s_{c_key}_{key}"] = round(rate(c_key), 1)
    defaults = [rate("map_default"), rate("iter_default")]
    low = math.nan if any(math.isnan(x) for x in defaults) else min(defaults)
    out[f"decode_default_fraction_of_loop_{key}"] = round(h.ratio(low, rate("loop")), 3)
    out[f"decode_speedup_vs_dataflux_{key}"] = round(h.ratio(low, rate("df_best")), 2)
    out[f"decode_speedup_vs_gcsfs_{key}"] = round(h.ratio(low, rate("gcsfs_cat")), 2)
    cpu = [
        float((med.get(k) or {}).get("client_cpu_ms_per_obj", math.nan))
        for k in ("map_default", "iter_default")
    ]
    hi = math.nan if any(math.isnan(x) for x in cpu) else max(cpu)
    out[f"decode_client_cpu_ms_per_mib_{key}"] = round(hi / (mean_bytes / MIB), 3)
    out[f"decode_jpeg_bytes_{key}"] = round(mean_bytes)
    out[f"decode_megapixels_{key}"] = round(shape[0] * shape[1] / 1e6, 3)
    return out


def run(args: Any, bench_py: str | None) -> dict[str, Any]:
    """Every decode size; the RESULT keys and a table printed."""
    table = DECODE_SMOKE if args.smoke else DECODE_SIZES
    if args.sizes:
        table = [t for t in table if t[0] in args.sizes.split(",")]
    scale = 1.0 if (args.quick or args.smoke) else 2.0
    result: dict[str, Any] = {}
    rows = []
    for key, target, count in table:
        n = max(2 * VARIANTS, round(count * scale))
        figures, med = run_size(key, target, n, args, bench_py)
        result.update(figures)
        for c_key, _label, *_ in CONTENDERS:
            if c_key in med:
                m = med[c_key]
                rows.append(
                    {
                        "size": f"{key} JPEG x {n} ({figures[f'decode_megapixels_{key}']} Mpx)",
                        "contender": c_key,
                        "cpu_ms_mib": m["client_cpu_ms_per_obj"]
                        / (figures[f"decode_jpeg_bytes_{key}"] / MIB),
                        **m,
                    }
                )
    h.print_table(
        "decode (JPEG decoded in data_format_fn; medians):",
        rows,
        [
            ("size", "size", "s"),
            ("contender", "contender", "s"),
            ("samples_per_s", "samples/s", ",.1f"),
            ("first_batch_s", "1st batch s", ".2f"),
            ("client_cpu_ms_per_obj", "CPU ms/obj", ".2f"),
            ("cpu_ms_mib", "CPU ms/MiB", ".2f"),
            ("server_cpu_s", "server CPU s", ".2f"),
            ("repeats", "runs", "d"),
        ],
    )
    return result
