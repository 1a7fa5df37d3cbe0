#!/usr/bin/python3
"""dilocox's projector side by side with PyTorch's powerSGD_hook, one thread each.

Same matrices (decaying spectra, written to a temporary file for our side), same
rank, same number of warm-started calls. PyTorch runs the real hook inside DDP
(gloo, world size 1) on a one-parameter module whose forward is sum(W * X), so the
weight's gradient is exactly X; the hook itself is timed. Error: ||X - X_hat||_F / ||X||_F after the last call.
Time: median per call over the calls after the first. Both start from random
subspaces, so each row is the median over --seeds random starts (error and time).
  /usr/bin/python3 bench/powersgd_vs_torch.py --ours build/bench/powersgd_ours
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd


def make_matrix(m, n, decay, seed):
    """X = U diag(i^-decay) V^T with random orthonormal U, V."""
    g = torch.Generator().manual_seed(seed)
    k = min(m, n)
    u, _ = torch.linalg.qr(torch.randn(m, k, generator=g))
    v, _ = torch.linalg.qr(torch.randn(n, k, generator=g))
    s = torch.arange(1, k + 1, dtype=torch.float32).pow(-decay)
    return (u * s) @ v.T


class Probe(torch.nn.Module):
    """One (m, n) weight; forward(x) = sum(W * x), so dLoss/dW = x."""

    def __init__(self, m, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(m, n))

    def forward(self, x):
        return (self.weight * x).sum()


def torch_powersgd(x, rank, iters, seed):
    m, n = x.shape
    layer = Probe(m, n)
    ddp = torch.nn.parallel.DistributedDataParallel(layer, bucket_cap_mb=1024)
    # start_powerSGD_iter must exceed 1 with warm start: the first 2 calls are plain allreduce.
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
                               min_compression_rate=0, use_error_feedback=False, warm_start=True,
                               orthogonalization_epsilon=0, random_seed=seed)
    seconds = []

    def timed_hook(st, bucket):  # DDP requires the parameter name `bucket`
        t0 = time.perf_counter()
        fut = psgd.powerSGD_hook(st, bucket)
        fut.wait()
        seconds.append(time.perf_counter() - t0)
        return fut

    ddp.register_comm_hook(state, timed_hook)
    out = None
    for _ in range(iters + 2):
        layer.weight.grad = None
        ddp(x).backward()  # d/dW = X
        out = layer.weight.grad.detach().clone()
    powersgd_calls = seconds[2:]
    err = float((x - out).norm() / x.norm())
    return err, statistics.median(powersgd_calls[1:])


def ours(binary, x, rank, iters, seed):
    with tempfile.NamedTemporaryFile(suffix=".f32", delete=False) as f:
        f.write(x.contiguous().numpy().tobytes())
        path = f.name
    try:
        res = subprocess.run([binary, path, str(x.shape[0]), str(x.shape[1]), str(rank), str(iters), str(seed)],
                             check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.unlink(path)
    r = json.loads(res.stdout)
    return r["error"], r["median_seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", required=True, help="path of the powersgd_ours binary")
    ap.add_argument("--iters", type=int, default=4, help="warm-started calls (>= 2)")
    ap.add_argument("--quick", action="store_true", help="one small matrix")
    ap.add_argument("--seeds", type=int, default=3, help="random starts per row (medians)")
    args = ap.parse_args()
    if not os.access(args.ours, os.X_OK):
        sys.exit(f"powersgd_vs_torch: {args.ours} is not an executable (build the bench target first)")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
        shapes = [(512, 512)] if args.quick else [(1024, 1024), (2048, 2048), (1024, 4096)]
        ranks = [8] if args.quick else [4, 16, 32]
        print(f"torch {torch.__version__}, 1 thread each, {args.iters} warm-started calls, error after the last, "
              f"medians over {args.seeds} random starts")
        print("| matrix | decay | rank | torch error | ours error | torch ms | ours ms | speedup |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for (m, n) in shapes:
            for decay in (1.0, 0.5):
                x = make_matrix(m, n, decay, seed=m + n)
                for r in ranks:
                    runs_t = [torch_powersgd(x, r, args.iters, s) for s in range(args.seeds)]
                    runs_o = [ours(args.ours, x, r, args.iters, s) for s in range(args.seeds)]
                    te, ts = (statistics.median(v) for v in zip(*runs_t))
                    oe, os_ = (statistics.median(v) for v in zip(*runs_o))
                    print(f"| {m}x{n} | {decay} | {r} | {te:.5f} | {oe:.5f} | {ts * 1e3:.1f} | {os_ * 1e3:.2f} |"
                          f" {ts / os_:.1f}x |", flush=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
