"""The plot helpers several sessions' figures share (matplotlib, headless, imported on first use)."""

import os

from summary.raw import HERE, served_levels

_figures_dir = HERE


def set_figure_dir(path: str):
    """Where figure_path() puts figures: benchmarks/ unless summarize.py --out names another folder."""
    global _figures_dir
    _figures_dir = path


def figure_path(name: str) -> str:
    return os.path.join(_figures_dir, name)


def pyplot():
    """matplotlib.pyplot, headless, imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def stream_panels():
    """A figure of two panels side by side (matplotlib, headless) -> (figure, axes)."""
    plt = pyplot()

    return plt.subplots(1, 2, figsize=(11, 4))


def save_stream_panels(fig, axes, xlabel: str, title: str, name: str):
    """Streams on a log2 axis in every panel, then the figure written as <name> (figure_path)."""
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(figure_path(name), dpi=110)


def save_panels(fig, axes, title: str, name: str):
    """A grid in every panel and the title, then the figure written as <name> (figure_path) and closed."""
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(figure_path(name), dpi=110)
    pyplot().close(fig)


def plot_playback(runs, title: str, out: str):
    fig, (a, b) = stream_panels()
    for label, raw, style in runs:
        lv = served_levels(raw)
        xs = [x for x in sorted(lv) if x >= 8]
        a.plot(xs, [100 * lv[x]["smooth_playback_frac"] for x in xs], style, label=label)
        b.plot(xs, [lv[x]["x_real_time"] for x in xs], style, label=label)
    a.set_ylabel("streams that play without a gap, %")
    b.set_ylabel("aggregate x real time")
    save_stream_panels(fig, (a, b), "concurrent streams, all starting at once", title, out)


def paired_bars(ax, ticks: list, series: list, fmt):
    """Bars side by side per tick, one per series [(label, color, values per tick)], each labelled fmt(value)."""
    w = 0.76 / len(series)
    for j, (label, color, vals) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * w for i in range(len(ticks))]
        ax.bar(xs, vals, w, color=color, label=label)
        for x, v in zip(xs, vals):
            ax.text(x, v, fmt(v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(ticks)), ticks, fontsize=8)


def run_bars(ax, runs: list, colors: list, xlim: tuple, xlabel: str):
    """One labelled horizontal bar per run, the first on top: runs [(label, value)]."""
    ys = [v for _, v in runs]
    ax.barh(range(len(ys)), ys, color=colors)
    for y, v in enumerate(ys):
        ax.text(v + 0.3, y, f"{v:.1f}", va="center", fontsize=7)
    ax.set_yticks(range(len(ys)), [r for r, _ in runs], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(*xlim)
    ax.set_xlabel(xlabel)


def ttfa_bars(ax, series: list, xlabel: str, fmt):
    """Served TTFA p50 per level, two runs side by side: series [(label, color, {streams: level})]."""
    levels = sorted(series[0][2])
    paired_bars(ax, [str(c) for c in levels],
                 [(label, color, [runs[c]["ttfa_ms"]["p50"] for c in levels]) for label, color, runs in series], fmt)
    ax.legend(fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("TTFA p50, ms")
    ax.set_title("served: first audio", fontsize=9)


def decoder_run_bars(ax, decoder_rows, kinds: dict, shapes: dict):
    """Bars of vae_precision.py's runs ((name, {shape: ms}), `vae_precision_log_runs`): per shape, the runs of
    each kind (a prefix of the name -> its label, before then after), each run its own bar with its ms."""
    for j, ((kind, label), color) in enumerate(zip(kinds.items(), ("#999", "#286"))):
        runs = [r for n, r in decoder_rows if n.startswith(kind)]
        for k, r in enumerate(runs):
            xs = [i + (2 * j + k - 1.5) * 0.18 for i in range(len(shapes))]
            ax.bar(xs, [r[s] for s in shapes], 0.18, color=color, alpha=1.0 if k == 0 else 0.6,
                   label=f"{label}, run {k + 1}")
            for x, s in zip(xs, shapes):
                ax.text(x, r[s], f"{r[s]:.1f}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(shapes)), list(shapes.values()))
    ax.set_ylabel("ms per decode call")
