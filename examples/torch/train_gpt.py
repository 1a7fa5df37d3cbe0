#!/usr/bin/python3
"""A small character-level GPT trained the way nanoGPT-style scripts train one (model,
get_batch, AdamW with warmup and cosine decay, gradient clipping, periodic eval,
checkpoints), converted to DiLoCoX with the lines marked `# dilocox` (README, "PyTorch"):
each process is a replica that trains alone for H steps, then the replicas exchange
compressed pseudo-gradients. Run with torchrun (gloo, CPU):

    torchrun --nproc_per_node 2 examples/torch/train_gpt.py --text README.md --iters 300

(or one process a replica with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as
tests/torch/test_train_gpt.py does: Debian 12's torchrun fails under Python 3.11).

Without the `# dilocox` lines it is the usual one-process loop. Prints the eval loss as
it goes and, last, one JSON line: the losses, the wire bytes, and a checksum of the
parameters (identical on every replica).
"""
import argparse
import json
import math
import os
import time
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F

import dilocox  # dilocox


# ---- the model: token + position embeddings, pre-norm blocks, tied head ----------

class SelfAttention(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.register_buffer("mask", torch.tril(torch.ones(context, context)).view(1, 1, context, context))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
        return self.out((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads, context)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab, width, layers, heads, context):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, context) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


# ---- data and schedule -------------------------------------------------------------

def load_text(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    cut = int(0.9 * len(data))
    return data[:cut], data[cut:], len(chars)


def get_batch(data, batch, context, gen):
    i = torch.randint(len(data) - context - 1, (batch,), generator=gen)
    x = torch.stack([data[j:j + context] for j in i])
    y = torch.stack([data[j + 1:j + 1 + context] for j in i])
    return x, y


def learning_rate(it, args):
    if it < args.warmup:
        return args.lr * (it + 1) / args.warmup
    progress = (it - args.warmup) / max(1, args.iters - args.warmup)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def estimate_loss(model, data, args):
    model.eval()
    gen = torch.Generator().manual_seed(1234)  # the same batches every time, on every replica
    losses = [model(*get_batch(data, args.batch, args.context, gen))[1].item() for _ in range(args.eval_batches)]
    model.train()
    return sum(losses) / len(losses)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", required=True, help="a UTF-8 text file: the corpus")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--compressor", default="dilocox", help="a method of dilocox.methods()")
    p.add_argument("--local-steps", type=int, default=20, help="H: inner steps a round")
    p.add_argument("--checkpoint", help="a folder: resume from it when it holds a checkpoint, save there at the end")
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group("gloo")  # dilocox: torchrun's environment
    rank = dist.get_rank()  # dilocox
    torch.manual_seed(0)  # every replica starts from the same weights
    train_data, val_data, vocab = load_text(args.text)
    model = GPT(vocab, args.width, args.layers, args.heads, args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    outer = dilocox.OuterLoop(model.named_parameters(), compressor=args.compressor,  # dilocox
                              local_steps=args.local_steps)  # dilocox
    gen = torch.Generator().manual_seed(100 + rank)  # each replica reads its own batches
    start = 0
    ckpt = os.path.join(args.checkpoint, f"ckpt{rank}.pt") if args.checkpoint else None
    if ckpt and os.path.exists(ckpt):
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        outer.load_state_dict(saved["outer"])  # dilocox
        gen.set_state(saved["generator"])
        start = saved["iter"]
    first = estimate_loss(model, val_data, args)
    wire = 0
    t0 = time.time()
    for it in range(start, args.iters):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(it, args)
        _, loss = model(*get_batch(train_data, args.batch, args.context, gen))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        report = outer.step()  # dilocox
        if report:  # dilocox
            wire += report["wire_bytes"]  # dilocox
        if rank == 0 and (it + 1) % args.eval_every == 0:
            print(f"iter {it + 1}: train loss {loss.item():.4f}, eval loss {estimate_loss(model, val_data, args):.4f}, "
                  f"{time.time() - t0:.1f} s", flush=True)
    wire += sum(s["wire_bytes"] for s in outer.finish())  # dilocox: every replica now holds the global model
    if ckpt:
        os.makedirs(args.checkpoint, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "outer": outer.state_dict(), "generator": gen.get_state(), "iter": args.iters}, ckpt)  # dilocox
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    summary = {"rank": rank, "first_eval_loss": first, "eval_loss": estimate_loss(model, val_data, args),
               "wire_bytes": wire, "parameters": flat.numel(), "rounds": outer.round,
               "checksum": zlib.crc32(flat.numpy().tobytes())}
    print(json.dumps(summary), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
