#!/usr/bin/env python3
"""Plots benches/rates.sh's results: CPU per message against the rate, log-log.

    python3 benches/rates_plot.py RESULTS OUT.png [--before RESULTS] [--title TEXT]

RESULTS is the per-run file rates.sh writes with OUT=FILE (one line per
run and subscriber: rep rate subscriber published counted ok|lost us/msg
sw/msg). Each subscriber is drawn at the median of its runs, with a bar
from the lowest to the highest. With --before, the drains of an earlier
build are drawn dashed beside them.

Needs matplotlib (a venv is enough: python3 -m venv /tmp/plot &&
/tmp/plot/bin/pip install matplotlib).
"""

import argparse
import statistics
from collections import defaultdict

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Subscriber, legend label, colour, marker.
SUBSCRIBERS = [
    ("drain-smol", "crate on smol (drain)", "tab:red", "o"),
    ("drain-tokio", "crate on tokio (drain)", "tab:blue", "s"),
    ("bare-smol", "bare reader on smol", "tab:red", "x"),
    ("bare-tokio", "bare reader on tokio", "tab:blue", "x"),
    ("bare", "bare reader, blocking std socket (floor)", "black", "^"),
]


def load(path):
    """{subscriber: {rate: [us/msg, ...]}} of the runs that saw every message."""
    runs = defaultdict(lambda: defaultdict(list))
    with open(path) as lines:
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[5] != "ok":
                continue
            runs[fields[2]][int(fields[1])].append(float(fields[6]))
    return runs


def draw(axes, runs, name, label, colour, marker, dashed=False):
    if name not in runs:
        return
    rates = sorted(runs[name])
    medians = [statistics.median(runs[name][r]) for r in rates]
    low = [m - min(runs[name][r]) for r, m in zip(rates, medians)]
    high = [max(runs[name][r]) - m for r, m in zip(rates, medians)]
    axes.errorbar(
        rates,
        medians,
        yerr=[low, high],
        label=label,
        color=colour,
        marker=marker,
        linestyle="--" if dashed else ("-" if name.startswith("drain") else ":"),
        alpha=0.45 if dashed else 1.0,
        capsize=3,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("out")
    parser.add_argument("--before", help="an earlier build's results: its drains, dashed")
    parser.add_argument("--title", default="Receive path: CPU per message at steady rates")
    args = parser.parse_args()

    runs = load(args.results)
    figure, axes = plt.subplots(figsize=(8, 5.5), dpi=110)
    if args.before:
        before = load(args.before)
        for name, label, colour, marker in SUBSCRIBERS[:2]:
            draw(axes, before, name, label + ", before", colour, marker, dashed=True)
    for subscriber in SUBSCRIBERS:
        draw(axes, runs, *subscriber)
    axes.set_xscale("log")
    axes.set_yscale("log")
    # Plain numbers on both axes: the rates measured, and round CPU times.
    rates = sorted({rate for subscriber in runs.values() for rate in subscriber})
    axes.set_xticks(rates, [f"{rate:,}" for rate in rates])
    axes.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
    axes.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    low, high = axes.get_ylim()
    axes.set_yticks([t for t in (0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500) if low <= t <= high])
    axes.set_ylim(low, high)
    axes.set_xlabel("messages a second (realistic mix, paced)")
    axes.set_ylabel("CPU per message (us, user + system, all threads)")
    axes.set_title(args.title, fontsize=11)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(args.out)


if __name__ == "__main__":
    main()
