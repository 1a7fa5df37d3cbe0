"""Runs a test body on N local processes joined by torch.distributed's gloo backend
(a file store, loopback), and fails unless every process ends as the body says.
Used by the torch-labelled ctest entries; needs the dilocox package on PYTHONPATH."""
import os
import queue
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _child(rank, world, store, body, args, results):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        out = body(rank, world, *args)
        results.put((rank, "ok", out))
    except BaseException as e:  # reported to the parent, which fails the test
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run(body, world=2, args=(), allow_exit=(), timeout=600):
    """body(rank, world, *args) on `world` processes; returns {rank: its return value}.
    Ranks in allow_exit may end without a result (a peer that dies on purpose). Fails
    as soon as a rank errs or exits without a result, or after `timeout` seconds."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        procs = [ctx.Process(target=_child, args=(r, world, store, body, args, results)) for r in range(world)]
        for p in procs:
            p.start()
        got = {}
        expected = world - len(allow_exit)
        deadline = time.monotonic() + timeout
        while len(got) < expected:
            try:
                rank, status, out = results.get(timeout=1)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in got and r not in allow_exit]
                if dead or time.monotonic() > deadline:
                    for p in procs:
                        p.kill()
                    what = f"rank {dead[0]} exited ({procs[dead[0]].exitcode}) without a result" if dead \
                        else f"no result within {timeout} s"
                    raise AssertionError(what)
                continue
            if status != "ok":
                for p in procs:
                    p.kill()
                raise AssertionError(f"rank {rank} failed: {out}")
            got[rank] = out
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                raise AssertionError("a process did not end")
    return got


def main(cases):
    """Runs the case named by argv[1] (or every case) and prints PASS or the failure."""
    names = sys.argv[1:] or list(cases)
    for name in names:
        if name not in cases:
            sys.exit(f"unknown case '{name}' ({', '.join(cases)})")
        cases[name]()
        print(f"PASS {name}", flush=True)
