#!/usr/bin/python3
"""The method study (docs/RESULTS.md, "The study: protocol"): every --sync method of
dilocox-train tuned on one seed with the same budget of runs, then run on held-out seeds at
the chosen setting, at several byte budgets, with DiLoCoX's levers, at 4 clusters, and timed on two emulated links.
Each run's summary is kept as OUT/runs/NAME.json; a run whose file exists is skipped, so an
interrupted study resumes where it stopped. At the end scripts/frontier_report.py summarises
OUT (report.md, frontier.png).

  frontier.py [--quick] [--out DIR] [--train BIN] [--data-dir DIR] [--stages tune,heldout,frontier,levers,k4,throughput]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import frontier_report

# The study's settings. FULL is the study; QUICK the same script end to end in minutes.
FULL = {
    "model": ["--model", "small", "--layers", "1"],  # width 256, 1 layer: 1.87 M parameters
    "batch": 16, "seq_len": 128, "tokens": 1_000_000, "clusters": 2, "eval_sequences": 128,
    "tune_seed": 1, "seeds": [2, 3, 4], "frontier_seeds": 2, "tune_runs": 4, "budgets": 2, "local_steps": 20, "fragments": 4,
    "tp_batch": 4, "tp_rounds": 3, "tp_allreduce_steps": 4,
}
QUICK = {
    "model": ["--model", "tiny"],
    "batch": 8, "seq_len": 32, "tokens": 12_000, "clusters": 2, "eval_sequences": 8,
    "tune_seed": 1, "seeds": [2], "frontier_seeds": 1, "tune_runs": 2, "budgets": 2, "local_steps": 8, "fragments": 2,
    "tp_batch": 4, "tp_rounds": 2, "tp_allreduce_steps": 3,
}
# Communication/compute ratios of AllReduce in the paper's two runs at 1 Gbit/s:
# DiLoCoX, compute-bound, over AllReduce, minus the compute: 23,880 / 745 - 1 and 3,728 / 10.4 - 1.
RATIOS = {"opt-1.3b": 23880 / 745 - 1, "107b": 3728 / 10.4 - 1}

OUTER = [[], ["--outer-momentum", "0.9"], ["--outer-lr", "1.0"], ["--outer-lr", "0.4"]]

# DiLoCoX's levers (RESULTS, "Why DiLoCoX is not the best above 1 MB"), each on its tuned
# setting at the frontier's seeds: name -> the flags added.
LEVERS = {
    "rank32": ["--rank", "32", "--max-rank", "64"],              # spend more bytes on rank
    "fixed_rank": ["--no-adaptive"],                               # rank 8 and H 20 throughout
    "fixed_rank32": ["--no-adaptive", "--rank", "32"],             # rank 32 and H 20 throughout
    "int8_half_rank": ["--bits", "8", "--rank", "4", "--max-rank", "16"],  # about the same bytes, finer factors
    "decayed_feedback": ["--outer-momentum", "0", "--knob", "error_decay=0.95"],  # SparseLoCo's memory
}


STAGES = ("tune", "heldout", "frontier", "levers", "k4", "throughput")


def methods(h, f):
    """name -> flags, tuning grid (first: the defaults), byte budgets beyond the chosen one.
    h: H of the chosen setting; f: the streaming fragments of the *_frag methods."""
    lengths = [["--local-steps", str(h // 2)], ["--local-steps", str(h * 2)]]
    return {
        "allreduce": {"flags": ["--sync", "allreduce"],
                      "tune": [["--lr", v] for v in ("1e-3", "2e-3", "5e-4", "2.5e-4")], "budgets": []},
        "diloco_fp32": {"flags": ["--sync", "diloco", "--bits", "32"], "tune": OUTER, "budgets": lengths},
        "diloco_int4": {"flags": ["--sync", "diloco", "--bits", "4"], "tune": OUTER, "budgets": lengths},
        "diloco_int4_frag": {"flags": ["--sync", "diloco", "--bits", "4", "--fragments", str(f)], "tune": OUTER,
                           "budgets": lengths},
        "cocktail": {"flags": ["--sync", "cocktail"], "tune": OUTER, "budgets": lengths},
        "sparseloco": {"flags": ["--sync", "sparseloco"],
                       "tune": [[], ["--knob", "error_decay=0.9"], ["--outer-lr", "0.7"], ["--outer-lr", "1.4"]],
                       "budgets": [["--knob", "k=16"], ["--knob", "k=32"]] + lengths},
        "dilocox": {"flags": ["--sync", "dilocox"], "tune": OUTER,
                    "budgets": [["--rank", "4", "--max-rank", "8"]] + lengths},
        "dilocox_frag": {"flags": ["--sync", "dilocox", "--fragments", str(f)], "tune": OUTER, "budgets": lengths},
    }


class Study:
    def __init__(self, args, cfg):
        self.cfg, self.train, self.out, self.data = cfg, args.train, args.out, args.data_dir
        self.runs = os.path.join(args.out, "runs")
        os.makedirs(self.runs, exist_ok=True)
        self.methods = methods(cfg["local_steps"], cfg["fragments"])
        self.ran = self.skipped = 0

    def common(self, clusters, seed, batch=None, tokens=None):
        c = self.cfg
        return c["model"] + ["--data-dir", self.data, "--clusters", str(clusters), "--batch", str(batch or c["batch"]),
                             "--seq-len", str(c["seq_len"]), "--tokens", str(tokens or c["tokens"]),
                             "--seed", str(seed), "--local-steps", str(c["local_steps"]), "--eval-every", "0",
                             "--eval-sequences", str(c["eval_sequences"]), "--quiet", "--checkpoint-minutes", "0"]

    def run(self, name, meta, flags, clusters):
        """Runs dilocox-train once (unless OUT/runs/NAME.json holds a run of the same flags);
        returns the record."""
        path = os.path.join(self.runs, name + ".json")
        if os.path.exists(path):
            with open(path) as f:
                kept = json.load(f)
            if kept["flags"] == flags:
                self.skipped += 1
                return kept
            print(f"frontier: {name}: the kept run had other flags (a setting it depends on changed): running again",
                  flush=True)
        cmd = ["mpirun", "-np", str(clusters), "--oversubscribe", self.train] + flags
        print(f"frontier: {name}: {' '.join(cmd)}", flush=True)
        t0 = time.time()
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        summary = json.loads(lines[-1]) if lines else None
        if summary is None:  # no summary: the run failed before its end (a bad flag, a crash)
            said = [l for l in p.stderr.splitlines() if l.startswith("dilocox-train")] or ["(no message)"]
            raise SystemExit(f"frontier: {name} exited {p.returncode} without a summary: {said[0]}")
        record = dict(meta, name=name, flags=flags, exit=p.returncode, seconds=time.time() - t0, summary=summary)
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
        self.ran += 1
        return record

    def tuning(self, m):
        return self.methods[m]["tune"][: self.cfg["tune_runs"]]

    def tune(self):
        """Every method's tuning grid on the tuning seed; AllReduce first, whose lr the others take."""
        seed = self.cfg["tune_seed"]
        for m in self.methods:
            for i, t in enumerate(self.tuning(m)):
                flags = self.common(self.cfg["clusters"], seed) + self.base(m) + t
                self.run(f"tune-{m}-{i}", {"stage": "tune", "method": m, "setting": t, "seed": seed}, flags,
                         self.cfg["clusters"])

    def chosen(self, m):
        """The setting of m's tuning runs with the lowest final eval loss (a diverged run: none)."""
        best, best_loss = None, float("inf")
        for i, t in enumerate(self.tuning(m)):
            path = os.path.join(self.runs, f"tune-{m}-{i}.json")
            if not os.path.exists(path):
                raise SystemExit(f"frontier: {m} is not tuned yet (run the tune stage)")
            with open(path) as f:
                loss = json.load(f)["summary"].get("final_eval_loss")
            if loss is not None and loss < best_loss:
                best, best_loss = t, loss
        if best is None:
            raise SystemExit(f"frontier: every tuning run of {m} diverged")
        return best

    def base(self, m):
        """m's flags; the outer methods train with the inner lr AllReduce's tuning chose."""
        return list(self.methods[m]["flags"]) + (self.chosen("allreduce") if m != "allreduce" else [])

    def setting(self, m):
        return self.base(m) + self.chosen(m)

    def heldout(self):
        for m in self.methods:
            for s in self.cfg["seeds"]:
                flags = self.common(self.cfg["clusters"], s) + self.setting(m)
                self.run(f"heldout-{m}-s{s}", {"stage": "heldout", "method": m, "budget": [], "seed": s}, flags,
                         self.cfg["clusters"])

    def frontier(self):
        for m, spec in self.methods.items():
            for b in spec["budgets"][: self.cfg["budgets"]]:
                tag = "_".join(x.lstrip("-").replace("=", "") for x in b)
                for s in self.cfg["seeds"][: self.cfg["frontier_seeds"]]:
                    flags = self.common(self.cfg["clusters"], s) + self.setting(m) + b
                    self.run(f"frontier-{m}-{tag}-s{s}", {"stage": "frontier", "method": m, "budget": b, "seed": s},
                             flags, self.cfg["clusters"])

    def k4(self):
        s = self.cfg["seeds"][0]
        for m in self.methods:
            self.run(f"k4-{m}-s{s}", {"stage": "k4", "method": m, "seed": s}, self.common(4, s) + self.setting(m), 4)

    def levers(self):
        for name, flags in LEVERS.items():
            for s in self.cfg["seeds"][: self.cfg["frontier_seeds"]]:
                self.run(f"lever-dilocox-{name}-s{s}", {"stage": "lever", "method": "dilocox", "lever": name,
                                                        "budget": flags, "seed": s},
                         self.common(self.cfg["clusters"], s) + self.setting("dilocox") + flags, self.cfg["clusters"])

    def throughput(self):
        """Each method unthrottled, then on two links whose rates give AllReduce the paper's
        communication/compute ratios: rate = AllReduce's bytes per step and site / (ratio x
        its compute seconds per step), both from AllReduce's unthrottled run."""
        c, s = self.cfg, self.cfg["seeds"][0]
        step_tokens = c["tp_batch"] * c["seq_len"] * c["clusters"]

        def tp(m, link, rate):
            steps = c["tp_allreduce_steps"] if m == "allreduce" else c["tp_rounds"] * c["local_steps"]
            flags = (self.common(c["clusters"], s, batch=c["tp_batch"], tokens=steps * step_tokens) + self.setting(m)
                     + ["--wan-bandwidth", f"{rate:.0f}bps", "--wan-latency", "0"])
            return self.run(f"tp-{m}-{link}", {"stage": "throughput", "method": m, "link": link,
                                               "bits_per_second": rate}, flags, c["clusters"])

        free = tp("allreduce", "unthrottled", 1e12)["summary"]
        step_seconds = step_tokens / free["tokens_per_second"]
        site_bytes = free["wire_bytes"] / c["clusters"] / free["steps"]
        rates = {link: 8 * site_bytes / (r * step_seconds) for link, r in RATIOS.items()}
        for m in self.methods:
            tp(m, "unthrottled", 1e12)
            for link, rate in rates.items():
                tp(m, link, rate)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the reduced study (tiny model, minutes)")
    ap.add_argument("--out", default=None, help="output folder (default out/frontier or out/frontier-quick)")
    ap.add_argument("--train", default="build/reference_trainer/dilocox-train")
    ap.add_argument("--data-dir", default="data/brown", help="train.bin and val.bin (scripts/prepare_data.sh)")
    ap.add_argument("--stages", default=",".join(STAGES))
    args = ap.parse_args()
    args.out = args.out or ("out/frontier-quick" if args.quick else "out/frontier")
    if not os.access(args.train, os.X_OK):
        sys.exit(f"frontier: no dilocox-train at {args.train} (build first, or pass --train)")
    study = Study(args, QUICK if args.quick else FULL)
    with open(os.path.join(args.out, "study.json"), "w") as f:
        json.dump({"quick": args.quick, "config": study.cfg, "ratios": RATIOS,
                   "methods": {m: {"flags": v["flags"], "tune": study.tuning(m)} for m, v in study.methods.items()}}, f)
    for stage in args.stages.split(","):
        if stage not in STAGES:
            sys.exit(f"frontier: unknown stage '{stage}' ({', '.join(STAGES)})")
        getattr(study, stage)()
    print(f"frontier: {study.ran} run(s) made, {study.skipped} kept from before, in {args.out}/runs")
    frontier_report.report(args.out)


if __name__ == "__main__":
    main()
