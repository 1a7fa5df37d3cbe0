#!/usr/bin/python3
"""Summarises a study made by scripts/frontier.py: frontier_report.py OUT reads OUT/runs/*.json
and writes OUT/report.md (tuning, held-out seeds, the frontier with the best method at each
byte budget, DiLoCoX's levers, 4 clusters, throughput) and, with gnuplot, OUT/frontier.png (final eval loss
against wire bytes per replica, log-x, one line per method, AllReduce as a horizontal line).
Bytes are those every replica put on the wire over the run (dilocox-train's wire_bytes over
the clusters); a ratio is against AllReduce's bytes at the same tokens."""
import json
import math
import os
import shutil
import statistics
import subprocess
import sys


def load(out):
    runs = []
    for name in sorted(os.listdir(os.path.join(out, "runs"))):
        if name.endswith(".json"):
            with open(os.path.join(out, "runs", name)) as f:
                runs.append(json.load(f))
    with open(os.path.join(out, "study.json")) as f:
        return json.load(f), runs


def loss(r):
    v = r["summary"].get("final_eval_loss")
    return v if v is not None else math.inf


def per_replica_bytes(r):
    s = r["summary"]
    return s.get("wire_bytes", 0) / max(1, s.get("clusters", 1))


def fmt_bytes(b):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def fmt_loss(v):
    return "diverged" if math.isinf(v) else f"{v:.4f}"


def groups(runs, stage):
    """(method, budget) -> runs of that stage."""
    g = {}
    for r in runs:
        if r["stage"] == stage:
            g.setdefault((r["method"], " ".join(r.get("budget", [])) or "chosen"), []).append(r)
    return g


def spread(rs):
    ls = [loss(r) for r in rs]
    return statistics.median(ls), min(ls), max(ls)


def tuning_table(runs):
    out = ["| method | setting (on its flags) | final eval loss, tuning seed |", "|---|---|---:|"]
    for r in runs:
        if r["stage"] == "tune":
            out.append(f"| {r['method']} | {' '.join(r['setting']) or 'defaults'} | {fmt_loss(loss(r))} |")
    return out


def frontier_points(runs):
    """[(method, budget, median bytes per replica, median loss, min, max, seeds)], held-out runs
    being each method's chosen budget."""
    pts = []
    for stage in ("heldout", "frontier"):
        for (m, b), rs in groups(runs, stage).items():
            med, lo, hi = spread(rs)
            pts.append((m, b, statistics.median(per_replica_bytes(r) for r in rs), med, lo, hi, len(rs)))
    return sorted(pts, key=lambda p: (p[0], p[2]))


def frontier_table(pts, allreduce_bytes):
    out = ["| method | budget | bytes per replica | vs AllReduce's bytes | final eval loss, median [min, max] | seeds |",
           "|---|---|---:|---:|---|---:|"]
    for m, b, by, med, lo, hi, n in pts:
        ratio = f"{allreduce_bytes / by:,.0f}x fewer" if m != "allreduce" and by > 0 and allreduce_bytes else "-"
        out.append(f"| {m} | {b} | {fmt_bytes(by)} | {ratio} | {fmt_loss(med)} [{fmt_loss(lo)}, {fmt_loss(hi)}] | {n} |")
    return out


def best_table(pts):
    """The method with the lowest median loss among the points within each byte decade's bound."""
    out = ["| budget: at most | best method (its bytes, median loss) |", "|---|---|"]
    compressed = [p for p in pts if p[0] != "allreduce" and p[2] > 0]
    if not compressed:
        return out
    lo = math.floor(math.log10(min(p[2] for p in compressed)))
    hi = math.ceil(math.log10(max(p[2] for p in compressed)))
    for e in range(lo + 1, hi + 1):
        within = [p for p in compressed if p[2] <= 10 ** e]
        if within:
            m, b, by, med, *_ = min(within, key=lambda p: p[3])
            out.append(f"| {fmt_bytes(10 ** e)} | {m} ({b}: {fmt_bytes(by)}, {fmt_loss(med)}) |")
    return out


def k4_table(runs):
    """Each method at 4 clusters beside its held-out run at 2 clusters on the same seed."""
    out = ["| method | 4 clusters: final eval loss | bytes per replica | 2 clusters, same seed: final eval loss | "
           "bytes per replica |", "|---|---:|---:|---:|---:|"]
    two = {(r["method"], r["seed"]): r for r in runs if r["stage"] == "heldout"}
    for r in runs:
        if r["stage"] == "k4":
            t = two.get((r["method"], r["seed"]))
            cells = f"{fmt_loss(loss(t))} | {fmt_bytes(per_replica_bytes(t))}" if t else "- | -"
            out.append(f"| {r['method']} | {fmt_loss(loss(r))} | {fmt_bytes(per_replica_bytes(r))} | {cells} |")
    return out


def levers_table(runs):
    """DiLoCoX's levers beside its chosen setting on the same seeds."""
    out = ["| DiLoCoX lever | flags added | bytes per replica | final eval loss, median [min, max] | seeds |",
           "|---|---|---:|---|---:|"]
    g = {}
    for r in runs:
        if r["stage"] == "lever":
            g.setdefault(r["lever"], []).append(r)
    seeds = {r["seed"] for rs in g.values() for r in rs}
    chosen = [r for r in runs if r["stage"] == "heldout" and r["method"] == "dilocox" and (r["seed"] in seeds or not seeds)]
    for name, flags, rs in [("none (the chosen setting)", "-", chosen)] + [(n, " ".join(rs[0]["budget"]), rs)
                                                                          for n, rs in g.items()]:
        if rs:
            med, lo, hi = spread(rs)
            by = statistics.median(per_replica_bytes(r) for r in rs)
            out.append(f"| {name} | {flags} | {fmt_bytes(by)} | {fmt_loss(med)} [{fmt_loss(lo)}, {fmt_loss(hi)}] | "
                       f"{len(rs)} |")
    return out


def throughput_table(runs):
    tp = {}
    for r in runs:
        if r["stage"] == "throughput":
            tp.setdefault(r["method"], {})[r["link"]] = r
    links = sorted({l for v in tp.values() for l in v if l != "unthrottled"})
    head = "| method | tokens/s unthrottled | " + " | ".join(
        f"{l}: tokens/s (utilization)" for l in links) + " | same loss on every link |"
    out = [head, "|---|---:|" + "---:|" * len(links) + "---|"]
    rates = []
    for m, v in tp.items():
        free = v.get("unthrottled")
        if not free:
            continue
        base = free["summary"]["tokens_per_second"]
        cells, same = [], True
        for l in links:
            r = v.get(l)
            if not r:
                cells.append("-")
                continue
            t = r["summary"]["tokens_per_second"]
            cells.append(f"{t:,.0f} ({t / base:.3f})")
            same = same and r["summary"].get("final_eval_loss") == free["summary"].get("final_eval_loss")
            if m == "allreduce":
                rates.append(f"{l}: {r['bits_per_second'] / 1e6:.3g} Mbit/s")
        out.append(f"| {m} | {base:,.0f} | " + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")
    return out, rates


def plot(out, pts, allreduce_loss):
    if not shutil.which("gnuplot"):
        print("frontier_report: gnuplot not found, no plot", file=sys.stderr)
        return
    methods = sorted({p[0] for p in pts if p[0] != "allreduce" and not math.isinf(p[3])})
    data = os.path.join(out, "frontier.dat")
    with open(data, "w") as f:
        for m in methods:
            f.write(f"# {m}\n")
            for p in pts:
                if p[0] == m and not math.isinf(p[3]) and p[2] > 0:
                    f.write(f"{p[2]} {p[3]} {p[4]} {p[5]}\n")
            f.write("\n\n")
    lines = [f"'{data}' index {i} using 1:2:3:4 with yerrorlines title '{m}'" for i, m in enumerate(methods)]
    if allreduce_loss is not None:
        lines.append(f"{allreduce_loss} with lines dashtype 2 lc 'black' title 'allreduce'")
    if not lines:  # a study stopped before its held-out runs
        print("frontier_report: no held-out runs yet, no plot", file=sys.stderr)
        return
    script = (f"set terminal pngcairo size 900,600 noenhanced; set output '{os.path.join(out, 'frontier.png')}';"
              "set logscale x; set xlabel 'bytes on the wire per replica'; set ylabel 'final eval loss (median, "
              "min-max over seeds)'; set key outside right; set grid;" + "plot " + ", ".join(lines))
    subprocess.run(["gnuplot", "-e", script], check=True)


def report(out):
    study, runs = load(out)
    pts = frontier_points(runs)
    ar = [p for p in pts if p[0] == "allreduce"]
    allreduce_bytes = ar[0][2] if ar else 0
    allreduce_loss = ar[0][3] if ar else None
    tp, rates = throughput_table(runs)
    c = study["config"]
    lines = [f"# Study{' (quick)' if study['quick'] else ''}: {len(runs)} runs",
             "", f"Model flags {' '.join(c['model'])}, {c['clusters']} clusters, batch {c['batch']} x {c['seq_len']} "
             f"per cluster, {c['tokens']:,} tokens per run, tuning seed {c['tune_seed']}, held-out seeds "
             f"{', '.join(map(str, c['seeds']))}.", "", "## Tuning", ""] + tuning_table(runs)
    lines += ["", "## Frontier (held-out seeds; 'chosen' is the tuned setting)", ""]
    lines += frontier_table(pts, allreduce_bytes)
    lines += ["", "## Best method at each byte budget", ""] + best_table(pts)
    lines += ["", "## DiLoCoX's levers (frontier seeds)", ""] + levers_table(runs)
    lines += ["", "## 4 clusters (first held-out seed)", ""]
    lines += k4_table(runs)
    lines += ["", "## Throughput (links: " + "; ".join(rates) + ")", ""] + tp
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(out, pts, allreduce_loss)
    print(f"frontier_report: {os.path.join(out, 'report.md')} ({len(runs)} runs)")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: frontier_report.py OUT (the folder frontier.py wrote)")
    report(sys.argv[1])


if __name__ == "__main__":
    main()
