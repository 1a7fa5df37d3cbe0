#!/usr/bin/python3
"""dilocox's projector side by side with PyTorch's powerSGD_hook, one thread each.

Same matrices (decaying spectra, written to a temporary file for our side), same
rank, same number of warm-started calls. PyTorch runs the real hook inside DDP
(gloo, world size 1) on a one-parameter module whose forward is sum(W * X), so the
weight's gradient is exactly X; the hook itself is timed. Ours is
PowerIterationProjector::approximate in bench/powersgd_ours. Error:
||X - X_hat||_F / ||X||_F after the last call. Time: median per call over the calls
after the first, in CPU time of the process (the machine may be shared: wall-clock
time counts other jobs' slices; the wall-clock ratio is printed too). Each row is the
median over --seeds random starts, torch and ours alternating. Refuses (exit 1) to
compare against the reference BLAS or with more than one thread on either side, and
names the BLAS and threads of both.
  /usr/bin/python3 bench/powersgd_vs_torch.py --ours build/bench/powersgd_ours
"""
import os

# One thread each side. OpenBLAS reads this when it is loaded, i.e. by `import torch`.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time

import numpy
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

# Below this single-thread SGEMM rate (512^3) a BLAS is not one a PyTorch user runs:
# Netlib's reference BLAS does ~4 GFLOP/s on the development machine, OpenBLAS ~60.
MIN_GEMM_GFLOPS = 12.0


# ---- which BLAS each side runs ---------------------------------------------------

def mapped_files():
    """Paths of the files mapped into this process, with their address ranges."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/"):
                lo, hi = (int(v, 16) for v in fields[0].split("-"))
                out.append((lo, hi, fields[5]))
    return out


def classify_blas(path):
    """'reference', 'OpenBLAS', 'MKL', 'BLIS', 'FlexiBLAS' or 'unknown' for a library path."""
    real = os.path.realpath(path)
    name = os.path.basename(real).lower()
    if "openblas" in real.lower():
        return "OpenBLAS"
    if "mkl" in name:
        return "MKL"
    if "blis" in name:
        return "BLIS"
    if "flexiblas" in name:
        return "FlexiBLAS"
    if name.startswith("libblas.so") and os.path.basename(os.path.dirname(real)) == "blas":
        return "reference"  # Debian's libblas3: /usr/lib/<triplet>/blas/libblas.so.3
    return "unknown"


def torch_blas():
    """(kind, description) of the library torch's sgemm_ calls resolve to, in this process."""
    files = mapped_files()
    torch_cpu = next((p for _, _, p in files if os.path.basename(p).startswith("libtorch_cpu")), None)
    provider = None
    if torch_cpu is not None:
        try:
            # dlsym on libtorch_cpu's handle searches its own dependency tree: the sgemm_ it calls.
            addr = ctypes.cast(ctypes.CDLL(torch_cpu).sgemm_, ctypes.c_void_p).value
            provider = next((p for lo, hi, p in files if lo <= addr < hi), None)
        except AttributeError:
            pass
    if provider is None:  # BLAS linked statically (e.g. PyPI's MKL builds): only the build string
        info = [w for w in torch.__config__.show().replace(",", " ").split() if w.startswith("BLAS_INFO=")]
        return "unknown", f"no shared sgemm_ ({info[0] if info else 'BLAS_INFO unknown'})"
    kind = classify_blas(provider)
    desc = os.path.realpath(provider)
    if kind == "OpenBLAS":
        lib = ctypes.CDLL(provider)
        lib.openblas_get_config.restype = ctypes.c_char_p
        desc = f"{lib.openblas_get_config().decode()}, {lib.openblas_get_num_threads()} thread(s), {desc}"
    return kind, desc


def sgemm_gflops(n=512, reps=7):
    """Best single-thread rate of torch.mm on (n, n) float32: the BLAS torch really runs."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9


def refuse(msg):
    print(f"powersgd_vs_torch: refusing to compare: {msg}", file=sys.stderr)
    sys.exit(1)


# ---- the two sides -------------------------------------------------------------

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


def time_hook(layer, state, hook, x, iters):
    """{"error", "cpu", "wall"} of DDP comm hook `hook` (with `state`) on the gradient x of
    layer's weight: 2 plain-allreduce calls, then `iters` compressed ones; the error after
    the last, the median time of those after the first."""
    ddp = torch.nn.parallel.DistributedDataParallel(layer, bucket_cap_mb=1024)
    cpu, wall = [], []

    def timed_hook(st, bucket):  # DDP requires the parameter name `bucket`
        c0, t0 = time.process_time(), time.perf_counter()
        fut = hook(st, bucket)
        fut.wait()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
        return fut

    ddp.register_comm_hook(state, timed_hook)
    out = None
    for _ in range(iters + 2):
        layer.weight.grad = None
        ddp(x).backward()  # d/dW = X
        out = layer.weight.grad.detach().clone()
    err = float((x - out).norm() / x.norm())
    # The first 2 calls are plain allreduce, the next one starts from a random Q.
    return {"error": err, "cpu": statistics.median(cpu[3:]), "wall": statistics.median(wall[3:])}


def torch_powersgd(x, rank, iters, seed):
    layer = Probe(*x.shape)
    # start_powerSGD_iter must exceed 1 with warm start: the first 2 calls are plain allreduce.
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
                               min_compression_rate=0, use_error_feedback=False, warm_start=True,
                               orthogonalization_epsilon=0, random_seed=seed)
    return time_hook(layer, state, psgd.powerSGD_hook, x, iters)


def run_ours(binary, args):
    res = subprocess.run([binary, *map(str, args)], check=True, capture_output=True, text=True)
    return json.loads(res.stdout)


def ours(binary, path, rank, iters, seed):
    r = run_ours(binary, [path, rank, iters, seed])
    return {"error": r["error"], "cpu": r["median_seconds"], "wall": r["median_wall_seconds"],
            "two_sweep_cpu": r["two_sweep_median_seconds"]}


def check_sides(binary):
    """Names the BLAS and threads of both sides; exits 1 where the comparison would be unfair."""
    kind, desc = torch_blas()
    rate = sgemm_gflops()
    if kind == "reference":
        refuse(f"torch runs the reference BLAS ({desc}); install libopenblas0-pthread "
               "(scripts/install_deps.sh --bench)")
    if rate < MIN_GEMM_GFLOPS:
        refuse(f"torch's SGEMM runs at {rate:.1f} GFLOP/s (< {MIN_GEMM_GFLOPS}: a reference-grade BLAS; {desc})")
    if torch.get_num_threads() != 1:
        refuse(f"torch uses {torch.get_num_threads()} threads")
    if kind == "OpenBLAS" and " 1 thread(s)" not in desc:
        refuse(f"OpenBLAS is not single-threaded ({desc})")
    info = run_ours(binary, ["--info"])
    if info["blas_library"] and classify_blas(info["blas_library"]) == "reference":
        refuse(f"ours runs the reference BLAS ({info['blas_library']})")
    if info["threads"] != 1:
        refuse(f"ours uses {info['threads']} threads")
    print(f"torch {torch.__version__}: BLAS {kind} ({desc}); SGEMM 512^3 {rate:.1f} GFLOP/s; "
          f"{torch.get_num_threads()} intra-op thread")
    print(f"ours: {info['blas']}; SIMD {info['simd']}; {info['threads']} thread")


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", required=True, help="path of the powersgd_ours binary")
    ap.add_argument("--iters", type=int, default=8, help="warm-started calls (>= 2)")
    ap.add_argument("--quick", action="store_true", help="one small matrix")
    ap.add_argument("--seeds", type=int, default=5, help="random starts per row (medians)")
    args = ap.parse_args()
    if not os.access(args.ours, os.X_OK):
        sys.exit(f"powersgd_vs_torch: {args.ours} is not an executable (build the bench target first)")
    torch.set_num_threads(1)
    check_sides(args.ours)
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
        shapes = [(512, 512)] if args.quick else [(1024, 1024), (2048, 2048), (1024, 4096)]
        ranks = [8] if args.quick else [4, 16, 32]
        print(f"CPU {cpu_name()}; {args.iters} warm-started calls, error after the last, time the median call "
              f"after the first (CPU time); medians over {args.seeds} random starts")
        print("| matrix | decay | rank | torch error | ours error | torch ms | torch GFLOP/s | ours ms | speedup "
              "| wall-clock speedup | ours two-sweep ms |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for (m, n) in shapes:
            for decay in (1.0, 0.5):
                x = make_matrix(m, n, decay, seed=m + n)
                path = os.path.join(d, "x.npy")  # what compress_tensors reads too
                numpy.save(path, x.contiguous().numpy())
                for r in ranks:
                    runs_t, runs_o = [], []
                    for s in range(args.seeds):  # alternate, so that load on the machine hits both
                        runs_t.append(torch_powersgd(x, r, args.iters, s))
                        runs_o.append(ours(args.ours, path, r, args.iters, s))
                    t = {k: statistics.median(run[k] for run in runs_t) for k in runs_t[0]}
                    o = {k: statistics.median(run[k] for run in runs_o) for k in runs_o[0]}
                    gflops = 6.0 * m * n * r / t["cpu"] / 1e9  # P = XQ, Q = X^T P, X_hat = P Q^T
                    print(f"| {m}x{n} | {decay} | {r} | {t['error']:.5f} | {o['error']:.5f} | {t['cpu'] * 1e3:.2f} |"
                          f" {gflops:.1f} | {o['cpu'] * 1e3:.2f} | {t['cpu'] / o['cpu']:.2f}x |"
                          f" {t['wall'] / o['wall']:.2f}x | {o['two_sweep_cpu'] * 1e3:.2f} |", flush=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
