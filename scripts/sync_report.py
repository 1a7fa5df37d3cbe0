#!/usr/bin/python3
"""Table and plots of dilocox-train runs: sync_report.py DIR NAME... reads
DIR/NAME.summary.json (the summary line) and DIR/NAME.jsonl (metrics), prints a table
(eval loss, tokens/s, wire bytes, compression ratio, hidden communication), and writes
DIR/eval_vs_tokens.png and DIR/eval_vs_seconds.png with gnuplot when it is installed."""
import json
import os
import shutil
import subprocess
import sys


def load(out, name):
    with open(os.path.join(out, name + ".summary.json")) as f:
        summary = json.loads(f.read().strip().splitlines()[-1])
    evals = []
    with open(os.path.join(out, name + ".jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if d.get("type") == "eval":
                evals.append((d["tokens"], d["seconds"], d["eval_loss"]))
    return summary, evals


def human(b):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def main():
    out, names = sys.argv[1], sys.argv[2:]
    runs = {n: load(out, n) for n in names}
    base = runs.get("allreduce", (None,))[0]
    print()
    print(f"{'run':22} {'eval loss':>9} {'vs AR':>6} {'tokens/s':>9} {'vs AR':>6} {'wire bytes':>11} "
          f"{'ratio':>7} {'hidden':>6} {'rank':>5} {'H':>4} {'wall s':>7}")
    for n, (s, _) in runs.items():
        loss_rel = f"{s['final_eval_loss'] / base['final_eval_loss']:.3f}" if base else "-"
        tps_rel = f"{s['tokens_per_second'] / base['tokens_per_second']:.1f}x" if base else "-"
        print(f"{n:22} {s['final_eval_loss']:9.4f} {loss_rel:>6} {s['tokens_per_second']:9.0f} {tps_rel:>6} "
              f"{human(s.get('wire_bytes', 0)):>11} {s.get('compression_ratio', 0):7.1f} "
              f"{s.get('comm_hidden_fraction', 0):6.2f} {s.get('final_rank', 0):5.1f} "
              f"{s.get('final_local_steps', 1):4d} {s['wall_seconds']:7.1f}")
    if "dilocox" in runs and "dilocox_unthrottled" in runs:
        a, b = runs["dilocox"][0], runs["dilocox_unthrottled"][0]
        print(f"\nDiLoCoX on the slow link runs at {a['tokens_per_second'] / b['tokens_per_second']:.0%} "
              f"of its tokens/s on an unthrottled link.")
    for n, (_, ev) in runs.items():
        with open(os.path.join(out, n + ".eval.dat"), "w") as f:
            for t, sec, loss in ev:
                f.write(f"{t} {sec} {loss}\n")
    if not shutil.which("gnuplot"):
        print("gnuplot not found: no plots")
        return
    for xcol, xlabel, png in ((1, "tokens (all clusters)", "eval_vs_tokens.png"),
                              (2, "wall-clock seconds", "eval_vs_seconds.png")):
        plots = ", ".join(f"'{os.path.join(out, n + '.eval.dat')}' using {xcol}:3 with linespoints title '{n}'"
                          for n in runs)
        script = (f"set terminal pngcairo size 900,560 noenhanced; set output '{os.path.join(out, png)}';"
                  f"set xlabel '{xlabel}'; set ylabel 'validation loss'; set grid; set key top right;"
                  f"plot {plots}")
        subprocess.run(["gnuplot", "-e", script], check=True)
        print(f"wrote {os.path.join(out, png)}")


if __name__ == "__main__":
    main()
