#!/usr/bin/python3
"""Writes gpt_golden.bin: the PyTorch reference for the C++ GPT (tests/trainer/test_gpt_golden.cpp).

A small GPT (V=96, C=16, 4 heads, 2 layers, 16 positions) with weights drawn here,
one batch (B=2, T=12), and what PyTorch computes from them in float64: logits, mean
cross-entropy loss and the gradient of every parameter. The tests read this file and
need no PyTorch. Regenerate with: /usr/bin/python3 tests/trainer/golden/make_gpt_golden.py

Layout (little-endian): b"DLXGOLD1", int32 [V, C, NH, L, maxT, B, T, n_params],
tokens int32 (B*T), targets int32 (B*T), params float64 (n_params, the C++ flat order:
wte, wpe, per layer ln_1.w/b, c_attn.w/b, attn c_proj.w/b, ln_2.w/b, c_fc.w/b,
mlp c_proj.w/b, then ln_f.w/b), logits float64 (B*T*V), loss float64, grads float64.
"""
import math
import os
import struct

import torch
import torch.nn.functional as F

V, C, NH, L, MAXT, B, T = 96, 16, 4, 2, 16, 2, 12
torch.manual_seed(1234)


def names_and_shapes():
    out = [("wte", (V, C)), ("wpe", (MAXT, C))]
    for l in range(L):
        h = f"h.{l}."
        out += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
                (h + "attn.c_attn.weight", (3 * C, C)), (h + "attn.c_attn.bias", (3 * C,)),
                (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
                (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
                (h + "mlp.c_fc.weight", (4 * C, C)), (h + "mlp.c_fc.bias", (4 * C,)),
                (h + "mlp.c_proj.weight", (C, 4 * C)), (h + "mlp.c_proj.bias", (C,))]
    return out + [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]


# Weights: float32 values (so the C++ float model holds them exactly), used in float64.
# Norm weights near 1 and non-zero biases, so every gradient path is exercised.
params = {}
for name, shape in names_and_shapes():
    if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
        w = 1.0 + 0.1 * torch.randn(shape)
    elif len(shape) == 1:
        w = 0.05 * torch.randn(shape)
    else:
        w = 0.3 * torch.randn(shape)
    params[name] = w.float().double().requires_grad_(True)

tokens = torch.randint(0, V, (B, T))
targets = torch.randint(0, V, (B, T))


def forward(p):
    x = p["wte"][tokens] + p["wpe"][:T]
    hs = C // NH
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = f"h.{l}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps=1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"].T + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[h + "attn.c_proj.weight"].T + p[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps=1e-5)
        m = F.gelu(m @ p[h + "mlp.c_fc.weight"].T + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"].T + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], eps=1e-5)
    return x @ p["wte"].T


logits = forward(params)
loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
loss.backward()

order = [n for n, _ in names_and_shapes()]
flat = torch.cat([params[n].detach().reshape(-1) for n in order])
grads = torch.cat([params[n].grad.reshape(-1) for n in order])
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_golden.bin")
with open(path, "wb") as f:
    f.write(b"DLXGOLD1")
    f.write(struct.pack("<8i", V, C, NH, L, MAXT, B, T, flat.numel()))
    f.write(tokens.to(torch.int32).numpy().tobytes())
    f.write(targets.to(torch.int32).numpy().tobytes())
    f.write(flat.numpy().astype("<f8").tobytes())
    f.write(logits.detach().reshape(-1).numpy().astype("<f8").tobytes())
    f.write(struct.pack("<d", loss.item()))
    f.write(grads.numpy().astype("<f8").tobytes())
print(f"wrote {path}: {flat.numel()} parameters, loss {loss.item():.6f}, torch {torch.__version__}")
