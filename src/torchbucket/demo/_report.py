"""The demo's summary table, its figure and ``summary.json``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

from torchbucket.demo._bucket import mib
from torchbucket.demo._data import CLASSES
from torchbucket.demo._job import DemoResult

__all__ = ["format_summary", "write_figure", "write_json"]


def _requests_line(requests: dict[str, dict[str, int]]) -> list[str]:
    lines = [f"  {'phase':<16} {'class A':>9} {'class B':>9}"]
    total_a = total_b = 0
    for phase, counts in requests.items():
        a, b = counts.get("A", 0), counts.get("B", 0)
        total_a += a
        total_b += b
        lines.append(f"  {phase:<16} {a:>9,} {b:>9,}")
    lines.append(f"  {'all':<16} {total_a:>9,} {total_b:>9,}")
    return lines


def format_summary(result: DemoResult, figure: str | None) -> str:
    """The summary table printed at the end of the demo."""
    out: list[str] = []
    rule = "-" * 78
    out.append(rule)
    out.append(f"torchbucket demo: {result.where}")
    out.append(rule)
    if result.generate_s:
        out.append(
            f"dataset           {result.objects:,} PNG images ({mib(result.dataset_bytes)}),"
            f" drawn in {result.generate_s:.1f} s"
        )
        out.append(
            f"upload            {result.upload_s:.1f} s, {result.objects / result.upload_s:,.0f} "
            f"objects/s, {result.upload_mb_s:.1f} MB/s"
        )
    else:
        out.append(f"dataset           {result.objects:,} PNG images (already in the bucket)")
    out.append(f"listing           {result.list_s:.2f} s for {result.objects:,} objects")
    out.append("training")
    out.append(
        f"  {'epoch':>5} {'job':>4} {'loss':>7} {'train acc':>10} {'held-out acc':>13} "
        f"{'samples/s':>10} {'seconds':>8}"
    )
    for r in result.history:
        out.append(
            f"  {r.epoch:>5} {r.job:>4} {r.loss:>7.3f} {r.train_accuracy:>10.1%} "
            f"{r.val_accuracy:>13.1%} {r.samples_per_s:>10,.0f} {r.seconds:>8.1f}"
        )
    if result.save_s:
        mean = sum(result.save_s) / len(result.save_s)
        out.append(
            f"checkpoints       save {mean:.2f} s each (mean of {len(result.save_s)}), "
            f"load {result.load_s:.2f} s; job 2 resumed after epoch {result.resumed_from_epoch}"
        )
    if result.requests:
        out.append("requests (class A: writes, lists, compose; class B: reads)")
        out.extend(_requests_line(result.requests))
        if result.cost_summary:
            out.append(f"  estimated cost  {result.cost_summary}")
        if result.server_cpu_s is not None:
            out.append(f"  emulator CPU    {result.server_cpu_s:.1f} s")
    chance = 1 / len(CLASSES)
    out.append(
        f"held-out accuracy {result.final_accuracy:.1%} (chance {chance:.1%}); "
        + ", ".join(f"{k} {v:.0%}" for k, v in result.per_class_accuracy.items())
    )
    clean = result.uploads_left == 0 and result.composites_left == 0
    out.append(
        f"left in bucket    {result.composites_left} composed objects, {result.uploads_left} incomplete "
        f"uploads: {'clean' if clean else 'NOT CLEAN'}"
    )
    out.append(f"total time        {result.total_s:.0f} s")
    if figure:
        out.append(f"figure            {figure}")
    out.append(rule)
    return "\n".join(out)


def write_figure(result: DemoResult, path: str) -> str:
    """Loss and accuracy, and throughput, per epoch, with the restart marked.

    Returns:
        The path written.
    """
    from matplotlib.figure import Figure  # the object API: no pyplot, no GUI backend

    epochs = [r.epoch for r in result.history]
    figure = Figure(figsize=(10, 4), layout="constrained")
    loss_ax, rate_ax = figure.subplots(1, 2)
    for r in result.history:  # every batch's loss, faint, at its fraction of the epoch
        n = max(1, len(r.batch_losses))
        loss_ax.plot(
            [r.epoch - 1 + (i + 1) / n for i in range(len(r.batch_losses))],
            r.batch_losses,
            color="tab:red",
            alpha=0.25,
            linewidth=0.8,
        )
    loss_ax.plot(
        epochs,
        [r.loss for r in result.history],
        "o-",
        color="tab:red",
        label="train loss (epoch mean)",
    )
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("train loss")
    acc_ax = loss_ax.twinx()
    acc_ax.plot(
        epochs,
        [r.val_accuracy for r in result.history],
        "s--",
        color="tab:blue",
        label="held-out accuracy",
    )
    acc_ax.set_ylabel("held-out accuracy")
    acc_ax.set_ylim(0, 1)
    # On the left x is time in epochs (epoch k ends at k); on the right, bars.
    restart = float(result.resumed_from_epoch)
    loss_ax.axvline(restart, color="grey", linestyle=":", linewidth=1)
    rate_ax.axvline(restart + 0.5, color="grey", linestyle=":", linewidth=1)
    for ax in (loss_ax, rate_ax):
        ax.set_xticks(range(0 if ax is loss_ax else 1, epochs[-1] + 1))
    loss_ax.text(restart, loss_ax.get_ylim()[1], " restart", va="top", fontsize=8, color="grey")
    handles = loss_ax.get_legend_handles_labels()[0] + acc_ax.get_legend_handles_labels()[0]
    loss_ax.legend(handles=handles, loc="center right", fontsize=8)
    loss_ax.set_title("training from the bucket")
    colours = ["tab:green" if r.job == 1 else "tab:purple" for r in result.history]
    rate_ax.bar(epochs, [r.samples_per_s for r in result.history], color=colours)
    rate_ax.set_xlabel("epoch (green: job 1, purple: job 2 after restart)")
    rate_ax.set_ylabel("samples / s (DataLoader + training)")
    rate_ax.set_title("throughput")
    figure.suptitle(f"torchbucket demo: {result.objects:,} images, {result.where}", fontsize=9)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def write_json(result: DemoResult, path: str) -> str:
    """Everything measured, as JSON, for scripts and tests."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(asdict(result), f, indent=2)
        f.write("\n")
    return path
