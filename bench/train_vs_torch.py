#!/usr/bin/python3
"""The reference trainer's CPU step side by side with the same GPT in PyTorch.

Both sides: the preset's shapes (pre-LayerNorm GPT, tied embeddings, GELU-tanh MLP),
GPT-2 initialization, batch 16 x the preset's context, one optimizer step = forward,
backward, global-norm clipping to 1.0 and AdamW (betas 0.9/0.95, eps 1e-8, weight
decay 0.1 on matrices). PyTorch runs the model as its users write it (nn.Linear,
masked softmax attention, torch.optim.AdamW, clip_grad_norm_) on the BLAS it loaded,
which must be OpenBLAS: the script refuses to run on the reference BLAS. Ours runs
bench/train_step_ours (the trainer's CpuStageModel). Every (preset, threads) cell runs
--reps times, the two sides alternating, each in a fresh process with the thread
count set (torch.set_num_threads, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS; ours
--threads); tokens/s = tokens per step / median step time over the timed steps of
all repetitions, and the ratio is the median of the per-repetition ratios. Before
timing, a check: both sides start from the same weights and batch (ours writes them)
and take --check-steps steps; their losses must agree to --loss-rtol. For one thread the
report also gives the ratio by CPU time, which holds on a machine shared with other work.
  /usr/bin/python3 bench/train_vs_torch.py --ours build/bench/train_step_ours
Exit status 0: goals met (>= 1.0x PyTorch with one thread; two threads >= 1.7x our one
thread); 3: a goal missed; 1: the loss check failed or the run could not be made fair.
"""
import argparse
import json
import math
import os
import platform
import statistics
import struct
import subprocess
import sys
import tempfile

PRESETS = {  # name: (layers, width, heads, vocab, context), as reference_trainer/model/gpt_config.hpp
    "tiny": (2, 64, 4, 4096, 64),
    "small": (4, 256, 4, 4096, 128),
    "medium": (8, 512, 8, 4096, 256),
}
BATCH = 16
BETAS, EPS, WEIGHT_DECAY, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0


# ---------------------------------------------------------------- the PyTorch model

def build_model(torch, preset):
    nn, F = torch.nn, torch.nn.functional
    L, C, NH, V, T = PRESETS[preset]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.attn = nn.Module()
            self.attn.c_attn, self.attn.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.mlp = nn.Module()
            self.mlp.c_fc, self.mlp.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

        def forward(self, x):
            B, Tn, _ = x.shape
            q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, Tn, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // NH))
            att = att.masked_fill(~self.mask[:Tn, :Tn], float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, Tn, C)
            x = x + self.attn.c_proj(y)
            return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Parameter(torch.empty(V, C))
            self.wpe = nn.Parameter(torch.empty(T, C))
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            for name, p in self.named_parameters():  # GPT-2 init, as ParamLayout::init
                if p.dim() == 1:
                    nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
                else:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            x = self.wte[idx] + self.wpe[: idx.shape[1]]
            for block in self.h:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.T
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

        def flat_order(self):  # the C++ flat parameter order (ParamLayout)
            names = ["wte", "wpe"]
            for l in range(L):
                names += [f"h.{l}.{n}" for n in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
                          "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",
                          "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
                          "mlp.c_proj.bias")]
            params = dict(self.named_parameters())
            return [params[n] for n in names + ["ln_f.weight", "ln_f.bias"]]

    return Gpt()


def make_optimizer(torch, model, lr):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=BETAS, eps=EPS)


def train_step(torch, model, opt, tokens, targets):
    opt.zero_grad(set_to_none=True)
    loss = model(tokens, targets)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return loss.item(), float(norm)


# ---------------------------------------------------------------- what each process loaded

def loaded_blas():
    """The BLAS libraries mapped into this process (paths from /proc/self/maps)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line}
    return sorted(p for p in paths if "blas" in os.path.basename(p).lower())


def refuse_reference_blas(paths, who):
    if not any("openblas" in p for p in paths):
        sys.exit(f"train_vs_torch: {who} runs on {paths or 'no BLAS'}, not OpenBLAS: no PyTorch user runs the "
                 "reference BLAS (install libopenblas0-pthread; update-alternatives --display "
                 "libblas.so.3-x86_64-linux-gnu)")


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


# ---------------------------------------------------------------- worker: PyTorch timing

def torch_worker(args):
    import time
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    model = build_model(torch, args.preset)
    opt = make_optimizer(torch, model, 1e-4)
    _, _, _, V, T = PRESETS[args.preset]
    tokens = torch.randint(0, V, (BATCH, T))
    targets = torch.randint(0, V, (BATCH, T))
    seconds, cpu_seconds = [], []
    for i in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        train_step(torch, model, opt, tokens, targets)
        if i >= args.warmup:
            cpu_seconds.append(time.process_time() - c0)
            seconds.append(time.perf_counter() - t0)
    refuse_reference_blas(loaded_blas(), "PyTorch")
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "blas": loaded_blas(),
                      "threads": torch.get_num_threads(), "torch": torch.__version__}))


# ---------------------------------------------------------------- the loss check

def read_dump(path):
    """train_step_ours --dump: b"DLXSTEP1", int32 [B, T, n_params, steps], tokens, targets
    (int32, B*T), params float32 (the flat order), then per step: loss, grad norm (float64)."""
    with open(path, "rb") as f:
        blob = f.read()
    assert blob[:8] == b"DLXSTEP1", "bad dump magic"
    B, T, n, steps = struct.unpack_from("<4i", blob, 8)
    off = 24
    tokens = struct.unpack_from(f"<{B * T}i", blob, off); off += 4 * B * T
    targets = struct.unpack_from(f"<{B * T}i", blob, off); off += 4 * B * T
    params = struct.unpack_from(f"<{n}f", blob, off); off += 4 * n
    stats = struct.unpack_from(f"<{2 * steps}d", blob, off)
    return B, T, tokens, targets, params, [(stats[2 * i], stats[2 * i + 1]) for i in range(steps)]


def loss_check(args, preset):
    import torch
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "step.bin")
        subprocess.run([args.ours, "--model", preset, "--dump", dump, "--steps", str(args.check_steps),
                        "--lr", str(args.check_lr)], check=True, env=thread_env(1), stdout=subprocess.DEVNULL)
        B, T, tokens, targets, params, ours = read_dump(dump)
    model = build_model(torch, preset)
    flat = torch.tensor(params, dtype=torch.float32)
    with torch.no_grad():
        off = 0
        for p in model.flat_order():
            p.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
    assert off == flat.numel(), f"{preset}: {flat.numel()} parameters from ours, {off} in the PyTorch model"
    opt = make_optimizer(torch, model, args.check_lr)
    tok = torch.tensor(tokens, dtype=torch.int64).view(B, T)
    tgt = torch.tensor(targets, dtype=torch.int64).view(B, T)
    worst = 0.0
    for step, (our_loss, our_norm) in enumerate(ours):
        loss, norm = train_step(torch, model, opt, tok, tgt)
        rel = abs(loss - our_loss) / abs(loss)
        worst = max(worst, rel)
        print(f"  {preset} step {step}: loss torch {loss:.7f} ours {our_loss:.7f} (rel {rel:.1e}); "
              f"grad norm torch {norm:.6f} ours {our_norm:.6f}")
    return worst


# ---------------------------------------------------------------- driver

def thread_env(n):
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(n)
    return env


def run_json(cmd, threads):
    out = subprocess.run(cmd, check=True, env=thread_env(threads), capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(args, preset, threads, rep):
    T = PRESETS[preset][4]
    ours_cmd = [args.ours, "--model", preset, "--threads", str(threads), "--steps", str(args.steps[preset]),
                "--warmup", str(args.warmup)]
    torch_cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--preset", preset, "--threads",
                 str(threads), "--steps", str(args.steps[preset]), "--warmup", str(args.warmup)]
    sides = [("ours", ours_cmd), ("torch", torch_cmd)]
    if rep % 2:
        sides.reverse()  # alternate which side runs first
    out = {}
    for name, cmd in sides:
        r = run_json(cmd, threads)
        out[name] = r
        med, cpu = statistics.median(r["seconds"]), statistics.median(r["cpu_seconds"])
        print(f"  rep {rep} {preset} {threads} thread(s) {name:5s}: {BATCH * T / med:8.1f} tokens/s "
              f"(median of {len(r['seconds'])} steps, {med:.3f} s wall, {cpu:.3f} s CPU)", flush=True)
    return out


def median_of(reps, side, key="seconds"):
    """Median over every timed step of every repetition."""
    return statistics.median([x for r in reps for x in r[side][key]])


def report(rows, threads_one=1):
    """The table; returns 3 when a goal is missed, else 0. CPU-time figures (1 thread only)
    count the time each process ran, so they hold on a machine shared with other work."""
    print("| preset | threads | ours tokens/s | PyTorch tokens/s | ours / PyTorch | ours / ours on 1 thread "
          "| 1 thread, by CPU time: ours / PyTorch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    status = 0
    for (p, n), reps in sorted(rows.items(), key=lambda kv: (kv[0][1], list(PRESETS).index(kv[0][0]))):
        tokens = BATCH * PRESETS[p][4]
        ours, theirs = tokens / median_of(reps, "ours"), tokens / median_of(reps, "torch")
        ratio = statistics.median(statistics.median(r["torch"]["seconds"]) / statistics.median(r["ours"]["seconds"])
                                  for r in reps)
        scaling = cpu = ""
        if n == threads_one:
            status = 3 if ratio < 1.0 else status
            cpu_ratio = statistics.median(statistics.median(r["torch"]["cpu_seconds"]) /
                                          statistics.median(r["ours"]["cpu_seconds"]) for r in reps)
            cpu = f"{cpu_ratio:.2f}x ({tokens / median_of(reps, 'ours', 'cpu_seconds'):,.0f} vs " \
                  f"{tokens / median_of(reps, 'torch', 'cpu_seconds'):,.0f})"
        elif (p, threads_one) in rows:
            x = median_of(rows[(p, threads_one)], "ours") / median_of(reps, "ours")
            scaling = f"{x:.2f}x"
            status = 3 if n == 2 and x < 1.7 else status
        print(f"| {p} | {n} | {ours:,.0f} | {theirs:,.0f} | {ratio:.2f}x | {scaling} | {cpu} |")
    return status


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", default="build/bench/train_step_ours")
    ap.add_argument("--presets", default="small,medium")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", default="small=4,medium=2,tiny=20", help="timed steps per process")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--check-steps", type=int, default=3)
    ap.add_argument("--check-lr", type=float, default=1e-3)
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--preset", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.threads, args.steps = int(args.threads), int(args.steps)
        return torch_worker(args)
    args.steps = {k: int(v) for k, v in (kv.split("=") for kv in args.steps.split(","))}
    presets = args.presets.split(",")
    threads = [int(t) for t in args.threads.split(",")]

    import torch
    torch_blas = loaded_blas()
    refuse_reference_blas(torch_blas, "PyTorch")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; torch {torch.__version__} on {', '.join(torch_blas)}")
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    our_blas = run_json([args.ours, "--model", "tiny", "--steps", "1", "--warmup", "0"], 1)["blas"]
    refuse_reference_blas(our_blas, "ours")
    print(f"ours on {', '.join(our_blas)}")
    worst = max(loss_check(args, p) for p in presets)
    print(f"loss check: largest relative difference {worst:.1e} (tolerance {args.loss_rtol:.0e})")
    if not worst <= args.loss_rtol:
        sys.exit("train_vs_torch: the two sides do not compute the same losses")

    rows = {}
    for rep in range(args.reps):
        for n in threads:
            for p in presets:
                rows.setdefault((p, n), []).append(measure(args, p, n, rep))
    print(f"\nload average at the end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; medians over {args.reps} repetitions, sides alternating\n")
    return report(rows, threads[0])


if __name__ == "__main__":
    sys.exit(main())
