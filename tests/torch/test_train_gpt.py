"""examples/torch/train_gpt.py (a nanoGPT-style loop converted with the README's lines)
as torchrun starts it (one process a replica, RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT in its environment: Debian 12's torchrun fails under Python 3.11 before it
starts any), 2 replicas on gloo: the eval loss falls below 75% of its start, every
replica ends with the same parameters (checksum), and the wire carries fewer bytes than
a per-step fp32 allreduce of the gradients would. Argument: the corpus (a text file)."""
import json
import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    corpus = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "README.md")
    iters, world = 200, 2
    cmd = [sys.executable, os.path.join(ROOT, "examples", "torch", "train_gpt.py"), "--text", corpus,
           "--iters", str(iters), "--width", "64", "--context", "32", "--eval-every", "50", "--local-steps", "20"]
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    stdout = "".join(o for o, _ in outs)
    print(stdout)
    for rank, (p, (_, err)) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            sys.exit(f"train_gpt.py rank {rank} exited {p.returncode}:\n{err[-4000:]}")
    summaries = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == world, f"expected {world} summaries, got {len(summaries)}"
    a = summaries[0]
    assert len({s["checksum"] for s in summaries}) == 1, "replicas differ after finish()"
    assert a["eval_loss"] < 0.75 * a["first_eval_loss"], f"eval loss {a['first_eval_loss']:.3f} -> {a['eval_loss']:.3f}"
    per_step_allreduce = iters * 2 * (world - 1) * 4 * a["parameters"] // world
    assert 0 < a["wire_bytes"] < per_step_allreduce
    print(f"eval loss {a['first_eval_loss']:.3f} -> {a['eval_loss']:.3f} in {iters} steps, {a['rounds']} rounds; "
          f"wire {a['wire_bytes']} bytes a replica, {per_step_allreduce / a['wire_bytes']:.0f}x fewer than a "
          f"per-step fp32 allreduce ({per_step_allreduce})")
    print("PASS train_gpt")


if __name__ == "__main__":
    main()
