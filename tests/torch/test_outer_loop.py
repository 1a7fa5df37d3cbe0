"""dilocox.OuterLoop in torch training, 2-3 gloo processes: for every method of the
registry the loss falls, the replicas' global parameters are identical after every
round and their parameters after finish() (also with the one-step-delay overlap, and
with fragments plus Streaming DiLoCo's overlap), and a checkpoint (torch.save of the loop's,
the model's and the optimizer's state) resumes bit for bit; bfloat16 parameters train."""
import os
import sys
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402


def make_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 16)).to(dtype)


def batch(rank, step, dtype=torch.float32):
    """A regression task every replica shares, drawn per (rank, step): replicas see different data."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(32, 32, generator=g)
    teacher = torch.Generator().manual_seed(7)
    a, b = torch.randn(32, 24, generator=teacher) / 32 ** 0.5, torch.randn(24, 16, generator=teacher) / 24 ** 0.5
    return x.to(dtype), (torch.tanh(x @ a) @ b).to(dtype)


def mse(out, y):
    return (out.float() - y.float()).square().mean()


def eval_loss(model, dtype=torch.float32):
    with torch.no_grad():
        losses = [mse(model(x), y).item() for x, y in (batch(99, s, dtype) for s in range(4))]
    return sum(losses) / len(losses)


def same_on_every_rank(tensors):
    """True when every rank holds bit-identical tensors."""
    flat = torch.cat([t.detach().float().reshape(-1) for t in tensors])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered)


def train(rank, method, steps, loop_kwargs, model=None, opt=None, loop=None, start=0, save_at=None, path=None):
    import dilocox
    model = model or make_model()
    opt = opt or torch.optim.Adam(model.parameters(), lr=1e-2)
    loop = loop or dilocox.OuterLoop(model.named_parameters(), compressor=method, **loop_kwargs)
    rounds_checked = 0
    for step in range(start, steps):
        if save_at is not None and step == save_at:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "loop": loop.state_dict()}, path)
        x, y = batch(rank, step, next(model.parameters()).dtype)
        loss = mse(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        report = loop.step()
        if report is not None:
            assert report["wire_bytes"] > 0, report
            assert same_on_every_rank(loop.global_parameters()), f"global parameters differ after step {step}"
            rounds_checked += 1
    loop.finish()
    assert same_on_every_rank(list(model.parameters())), "parameters differ after finish()"
    return model, rounds_checked


def every_method_trains(rank, world, method, extra):
    import dilocox
    kwargs = dict(local_steps=6, timeout=60, **extra)
    before = eval_loss(make_model())
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"ckpt{rank}.pt")
        model, rounds = train(rank, method, 60, kwargs, save_at=30, path=path)
        after = eval_loss(model)
        assert rounds >= 5, f"{method}: only {rounds} syncs reported"
        assert after < 0.7 * before, f"{method}: eval loss {before:.4f} -> {after:.4f}"
        # Resume from step 30 in a fresh model, optimizer and loop.
        state = torch.load(path)
        model2 = make_model(seed=123)
        model2.load_state_dict(state["model"])
        opt2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
        opt2.load_state_dict(state["opt"])
        loop2 = dilocox.OuterLoop(model2.named_parameters(), compressor=method, **kwargs)
        loop2.load_state_dict(state["loop"])
        resumed, _ = train(rank, method, 60, kwargs, model=model2, opt=opt2, loop=loop2, start=30)
        for (n, a), b in zip(model.named_parameters(), resumed.parameters()):
            assert torch.equal(a, b), f"{method}: resumed '{n}' differs by {(a - b).abs().max().item():.3g}"
    return before, after


def bf16_trains(rank, world):
    model = make_model(dtype=torch.bfloat16)
    before = eval_loss(model, torch.bfloat16)
    model, _ = train(rank, "dilocox", 60, dict(local_steps=5, timeout=60), model=model)
    after = eval_loss(model, torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert after < 0.7 * before, f"bf16: eval loss {before:.4f} -> {after:.4f}"
    return before, after


def method_case(method, world=2, **extra):
    def case():
        got = harness.run(every_method_trains, world=world, args=(method, extra))
        print(f"{method} x{world} {extra}: eval loss {got[0][0]:.4f} -> {got[0][1]:.4f}")
    return case


def bf16_case():
    got = harness.run(bf16_trains)
    print(f"dilocox bf16: eval loss {got[0][0]:.4f} -> {got[0][1]:.4f}")


if __name__ == "__main__":
    import dilocox
    cases = {m["name"]: method_case(m["name"]) for m in dilocox.methods() if not m["per_step"]}
    cases["dilocox_3"] = method_case("dilocox", world=3)
    cases["dilocox_overlap"] = method_case("dilocox", overlap=True)
    cases["diloco_streaming"] = method_case("diloco", fragments=2, overlap_steps=1)
    cases["bf16"] = bf16_case
    harness.main(cases)
