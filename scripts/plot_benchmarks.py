"""Plots the benchmarks' JSON outputs; scripts/plot-benchmarks runs the benchmarks and calls this.

    python scripts/plot_benchmarks.py KIND INPUT.json OUTPUT.svg [--png]

KIND is one of the keys of PLOTS:

  request-path  the JSON of `request-path --json PATH`: {"variants": [{"label", "samples_ms",
                "model_ms", "summary": {...}}, ...], "config": {...}, "goal": {...}}
  dispatch-lag  the JSON of `dispatch-lag-sim --json PATH`: {"configurations": [{"name",
                "lags_ms": [...]}, ...]} (other keys are ignored; "title" and "note", if present,
                head and foot the plot)

Each plot is one figure of two panels over the same groups of samples: an empirical CDF (left)
and a box plot with every sample drawn over it (right). To add a plot, write a function that
reads its JSON into `Group`s and calls `distribution_figure`, and list it in PLOTS.

The SVG is written without a date and with fixed element ids, so a plot of the same numbers
is the same file. `--png` also writes OUTPUT with a .png suffix (for a quick look).
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Same numbers, same file: no date in the SVG, ids from a fixed salt.
plt.rcParams["svg.hashsalt"] = "outbox-benchmarks"
plt.rcParams["svg.fonttype"] = "none"

MATPLOTLIB_3_10 = tuple(int(part) for part in matplotlib.__version__.split(".")[:2]) >= (3, 10)

# The request-path calls in the order the benchmark prints them.
CALLS = ["get", "put", "update", "transact", "send", "batch"]

COLOURS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


@dataclass
class Group:
    """One distribution: a variant or a configuration."""

    label: str
    samples: list[float]
    # A reference value drawn as a marker on the box plot (e.g. the model's latency).
    reference: float | None = None
    # Extra text after the label in the legend.
    note: str = ""


def number(value: float) -> str:
    """1 decimal below 100, none from 100."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"


def percentile(sorted_samples: list[float], q: float) -> float:
    """Nearest-rank percentile, as the Rust side computes it."""
    import math

    rank = math.ceil(q * len(sorted_samples))
    return sorted_samples[min(max(rank, 1), len(sorted_samples)) - 1]


def distribution_figure(
    groups: list[Group],
    *,
    title: str,
    subtitle: str,
    xlabel: str,
    footer: str = "",
    reference_label: str | None = None,
    symlog: float | None = None,
    legend: str = "lower right",
):
    """An ECDF panel and a box-plot panel of `groups`; returns the figure. `legend` is a
    matplotlib location inside the CDF panel, or "below" it."""
    fig, (cdf, box) = plt.subplots(
        1, 2, figsize=(13, 0.55 * max(len(groups), 4) + 3.2), gridspec_kw={"width_ratios": [1.1, 1]}
    )
    for index, group in enumerate(groups):
        colour = COLOURS[index % len(COLOURS)]
        xs = sorted(group.samples)
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        p50, p99 = percentile(xs, 0.5), percentile(xs, 0.99)
        text = f"{group.label}: p50 {number(p50)}, p99 {number(p99)}"
        if group.note:
            text += f" {group.note}"
        cdf.step(xs, ys, where="post", color=colour, linewidth=1.6, label=text)
    cdf.set_xlabel(xlabel)
    cdf.set_ylabel("fraction of requests at or below")
    cdf.set_ylim(0, 1.02)
    for q in (0.5, 0.99):
        cdf.axhline(q, color="#999999", linewidth=0.6, linestyle=":")
    cdf.grid(True, alpha=0.3)
    if legend == "below":
        cdf.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8, ncol=2, frameon=False)
    else:
        cdf.legend(loc=legend, fontsize=8, framealpha=0.9)
    cdf.set_title("empirical CDF", fontsize=10)

    # Box plot, first group on top.
    positions = list(range(len(groups), 0, -1))
    data = [group.samples or [float("nan")] for group in groups]
    # `orientation` replaced `vert` in matplotlib 3.10; both are accepted up to 3.12.
    horizontal = {"orientation": "horizontal"} if MATPLOTLIB_3_10 else {"vert": False}
    parts = box.boxplot(
        data,
        positions=positions,
        **horizontal,
        whis=(1, 99),
        widths=0.55,
        showfliers=False,
        patch_artist=True,
        medianprops={"color": "black", "linewidth": 1.4},
    )
    for index, patch in enumerate(parts["boxes"]):
        patch.set_facecolor(COLOURS[index % len(COLOURS)])
        patch.set_alpha(0.35)
    # Every sample, jittered vertically so that they do not hide each other.
    import random

    rng = random.Random(1)
    for index, (position, group) in enumerate(zip(positions, groups)):
        colour = COLOURS[index % len(COLOURS)]
        ys = [position + rng.uniform(-0.18, 0.18) for _ in group.samples]
        # Rasterized: thousands of dots as vectors would make the SVG heavy.
        box.scatter(group.samples, ys, s=4, color=colour, alpha=0.35, linewidths=0, rasterized=True)
    references = [(position, group.reference) for position, group in zip(positions, groups) if group.reference is not None]
    if references:
        box.scatter(
            [value for _, value in references],
            [position for position, _ in references],
            marker="D",
            s=36,
            facecolor="white",
            edgecolor="black",
            zorder=5,
            label=reference_label,
        )
        if reference_label:
            box.legend(loc="upper right", fontsize=8, framealpha=0.9)
    box.set_yticks(positions)
    box.set_yticklabels([group.label for group in groups], fontsize=9)
    box.set_xlabel(xlabel)
    box.grid(True, axis="x", alpha=0.3)
    box.set_title("box: p25-p75, median, whiskers p1-p99; dots: every sample", fontsize=10)

    if symlog is not None:
        everything = [x for group in groups for x in group.samples]
        low, high = min(everything, default=0.0), max(everything, default=1.0)
        # Room on both sides, and zero always in view.
        left = low * 1.5 if low < -symlog else min(low, 0.0) - symlog / 2
        right = high * 1.5 if high > symlog else high + symlog
        for axis in (cdf, box):
            axis.set_xscale("symlog", linthresh=symlog)
            axis.set_xlim(left, right)

    fig.suptitle(title, fontsize=12, fontweight="bold")
    fig.text(0.5, 0.925, subtitle, ha="center", fontsize=9)
    height = fig.get_figheight()
    lines = []
    for paragraph in footer.splitlines():
        lines.extend(textwrap.wrap(paragraph, width=190) or [""])
    if lines:
        fig.text(0.01, 0.01, "\n".join(lines), ha="left", va="bottom", fontsize=8, color="#444444")
    # About 0.14 inch per 8-point line.
    bottom = (0.14 * len(lines) + 0.1) / height
    fig.tight_layout(rect=(0, bottom, 1, 0.91))
    return fig


def plot_request_path(data: dict):
    """(a)-(e): each variant's one-at-a-time latencies, with its model as a marker."""
    config = data["config"]
    named = config["latencies"]
    order = [key for key in CALLS if key in named] + [key for key in named if key not in CALLS]
    latencies = ", ".join(f"{key} ({named[key]['aws']}) {named[key]['ms']:g}" for key in order)
    groups = []
    for variant in data["variants"]:
        summary = variant["summary"]
        note = ""
        if summary.get("p50_over_b") is not None:
            note = f"({summary['p50_over_b']:.2f}x (b))"
        groups.append(
            Group(
                label=variant["label"],
                samples=variant["samples_ms"],
                reference=variant["model_ms"],
                note=note,
            )
        )
    goal = data.get("goal")
    if goal:
        verdict = "met" if goal["met"] else "not met"
        goal_text = f"(d)/(b) p50 = {goal['measured']:.2f} (goal <= {goal['limit']:g}): {verdict}; model {goal['model']:.2f}"
    else:
        goal_text = "(d)/(b) not measured"
    footer = "\n".join(
        [
            "(a) GetItem + conditional PutItem, no event; (b) (a) + SendMessage of the event (not atomic); (c) outbox: control"
            " SendMessage, then GetItem, then TransactWriteItems; (d) outbox as built: control SendMessage overlapped with GetItem,"
            " then TransactWriteItems; (e) (d) + inline publishing (SendMessageBatch + BatchWriteItem).",
            f"Embedded backend, modelled call latencies (ms): {latencies}; jitter +-{config['jitter'] * 100:.0f}%, seed {config['seed']},"
            f" timer {config['timer']}, {config['requests']} requests per variant one at a time."
            "  Made by scripts/plot-benchmarks (request-path --json).",
        ]
    )
    return distribution_figure(
        groups,
        title="Request-path latency by variant (one request at a time)",
        subtitle=goal_text,
        xlabel="latency (ms)",
        footer=footer,
        reference_label="model: nominal latencies added (max where overlapped)",
    )


def plot_dispatch_lag(data: dict):
    """Dispatch lag by configuration: how long after the answer the event is published."""
    groups = [
        Group(label=configuration.get("label") or configuration["name"], samples=configuration["lags_ms"])
        for configuration in data["configurations"]
    ]
    everything = [lag for group in groups for lag in group.samples]
    # Lags run from about zero (inline) to seconds (first-check delays): a linear scale
    # near zero, logarithmic beyond, when they span more than two decades.
    spread = max((abs(lag) for lag in everything), default=0.0)
    symlog = 10.0 if spread > 1000.0 else None
    # Whatever else the JSON says about the run (seed, rate, latencies...), as written.
    settings = []
    for key, value in data.items():
        if key in ("configurations", "measure", "title", "note"):
            continue
        if isinstance(value, dict):
            value = ", ".join(f"{name} {number_or_text(item)}" for name, item in value.items())
            settings.append(f"{key}: {value}")
        elif not isinstance(value, list):
            settings.append(f"{key}: {number_or_text(value)}")
    footer = "\n".join(
        line
        for line in [
            data.get("note", ""),
            "; ".join(settings),
            "Made by scripts/plot-benchmarks (dispatch-lag-sim --json).",
        ]
        if line
    )
    subtitle = data.get("measure") or "time from the commit's acknowledgement to its event being on the destination queue"
    return distribution_figure(
        groups,
        title=data.get("title") or "Dispatch lag by configuration",
        subtitle=subtitle + " (negative: published before the answer)",
        xlabel="dispatch lag (ms)" + (", symmetric log scale" if symlog else ""),
        footer=footer,
        symlog=symlog,
        legend="below",
    )


def number_or_text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


PLOTS = {
    "request-path": plot_request_path,
    "dispatch-lag": plot_dispatch_lag,
}


def main(argv: list[str]) -> int:
    args = [arg for arg in argv if arg != "--png"]
    if len(args) != 3 or args[0] not in PLOTS:
        print(__doc__, file=sys.stderr)
        return 2
    kind, source, target = args[0], Path(args[1]), Path(args[2])
    data = json.loads(source.read_text())
    figure = PLOTS[kind](data)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, metadata={"Date": None})
    print(f"plot-benchmarks: {kind}: wrote {target}")
    if "--png" in argv:
        png = target.with_suffix(".png")
        figure.savefig(png, dpi=110)
        print(f"plot-benchmarks: {kind}: wrote {png}")
    plt.close(figure)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
