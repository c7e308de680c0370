#!/usr/bin/python3
"""Turns decode_loop --json output into a PNG chart.

usage: /usr/bin/python3 bench/plot_decode_loop.py RUN.json [OUT.png]

Left:  p50 latency per length band, eager against graph replay (bars; whiskers reach p99), with the
       kernel (V1 / V2 and its partition size) written under each band.
Right: per-step latency over the run, eager and graph, coloured by kernel (V1 / V2), so the swap at
       the threshold shows as a change of colour; steps that captured a graph (or, under --policy
       measured, timed the bucket's candidates) are marked.
Needs Debian's python3-matplotlib (run with /usr/bin/python3).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    src = argv[1]
    dst = argv[2] if len(argv) > 2 else (src[:-5] if src.endswith(".json") else src) + ".png"
    with open(src) as f:
        run = json.load(f)
    if run.get("mode") == "plan-only":
        print("%s holds plans only (decode_loop --plan-only): nothing to plot" % src)
        return 2

    cfg = run["config"]
    bands = run["bands"]
    steps = run["steps"]
    cpu = run.get("timing") == "cpu-host-backend"
    timing = "CPU timings, host backend" if cpu else "GPU wall-clock, %s" % run.get("device", "")

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [1, 1.3]})
    fig.suptitle(
        "decode_loop: %s (%dq/%dkv, d%d, %s), batch %d, %d layers, policy %s (%s)"
        % (cfg["preset"], cfg["q_heads"], cfg["kv_heads"], cfg["head_size"], cfg["dtype"], cfg["batch"],
           cfg["layers"], cfg.get("policy", "threshold"), timing),
        fontsize=11)

    # ---- left: per band, eager vs graph
    xs = list(range(len(bands)))
    w = 0.38
    colors = {"v1": "#4C72B0", "v2": "#DD8452"}
    for i, b in enumerate(bands):
        k = b["kernel"]
        e50, e99 = b["eager_p50_us"], b["eager_p99_us"]
        ax1.bar(i - w / 2, e50, w, color=colors.get(k, "grey"), alpha=0.45, edgecolor="black", hatch="//")
        ax1.errorbar(i - w / 2, e50, yerr=[[0], [max(0.0, e99 - e50)]], color="black", capsize=3, lw=1)
        if b["graph_p50_us"] is not None:
            g50, g99 = b["graph_p50_us"], b["graph_p99_us"]
            ax1.bar(i + w / 2, g50, w, color=colors.get(k, "grey"), edgecolor="black")
            ax1.errorbar(i + w / 2, g50, yerr=[[0], [max(0.0, g99 - g50)]], color="black", capsize=3, lw=1)
            if b["speedup"]:
                ax1.annotate("%.2fx" % b["speedup"], (i + w / 2, g50), textcoords="offset points", xytext=(0, 3),
                             ha="center", fontsize=8)
    labels = []
    for b in bands:
        kern = b["kernel"].upper() + (" P%d" % b["partition_size"] if b["kernel"] == "v2" else "")
        n = b.get("q_len", 1)  # a verify loop's rows are per (band, n); older files have no q_len
        labels.append("(%d, %d]\n%s%s" % (b["band_lo"], b["band_hi"], kern, " n=%d" % n if n > 1 else ""))
    ax1.set_xticks(xs)
    ax1.set_xticklabels(labels, fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel("µs per step, log (p50; whisker to p99)")
    ax1.set_xlabel("length band (largest seq_len), kernel")
    ax1.set_title("per band: eager (hatched) vs graph (solid); speedup above")
    from matplotlib.patches import Patch

    ax1.legend(handles=[Patch(facecolor=colors["v1"], label="V1"), Patch(facecolor=colors["v2"], label="V2"),
                        Patch(facecolor="white", edgecolor="black", hatch="//", label="eager"),
                        Patch(facecolor="white", edgecolor="black", label="graph")], fontsize=8)

    # ---- right: per step over the run
    idx = list(range(len(steps)))
    for kind in ("v1", "v2"):
        sel = [i for i in idx if steps[i]["kernel"] == kind]
        if not sel:
            continue
        ax2.scatter(sel, [steps[i]["eager_us"] for i in sel], s=10, marker="x", color=colors[kind],
                    label="eager %s" % kind.upper())
        ax2.scatter(sel, [steps[i]["graph_us"] for i in sel], s=12, marker="o", color=colors[kind],
                    facecolors="none", label="graph %s" % kind.upper())
    cap = [i for i in idx if steps[i]["captured"] or steps[i].get("measured")]
    if cap:
        ax2.scatter(cap, [steps[i]["graph_us"] for i in cap], s=60, marker="*", color="red",
                    label="graph step that captured (or measured)")
    for i in idx[1:]:
        if steps[i]["segment"] != steps[i - 1]["segment"]:
            ax2.axvline(i - 0.5, color="grey", lw=0.8, ls="--")
    ax2.set_yscale("log")
    ax2.set_xlabel("step (dashed lines: new --start-lens segment)")
    ax2.set_ylabel("µs per step (log)")
    ax2.set_title("every step: eager vs graph, V1 vs V2")
    ax2.legend(fontsize=8, loc="upper left")
    if cpu:
        fig.text(0.5, 0.005, "host backend: these are CPU timings, not GPU timings; graph and eager run the same "
                 "host code", ha="center", fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(dst, dpi=110)
    print(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
