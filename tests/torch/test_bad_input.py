"""Bad input to dilocox.OuterLoop is a Python exception with a message on every rank,
never a hang: parameter lists that differ across ranks, an integer tensor on one rank,
an unknown method or knob, a replaced parameter, a loaded state of another loop,
replicas that start from different weights, a replica whose parameters turn NaN
(nonfinite="raise": an error on every rank; the default: dropped from the round, said
in the report and the log), a stalled peer (an error within the timeout) and a peer
that dies mid-round."""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))


def expect_error(fn, *fragments):
    import dilocox
    try:
        fn()
    except dilocox.Error as e:
        for f in fragments:
            assert f in str(e), f"message lacks '{f}': {e}"
        return str(e)
    raise AssertionError(f"no dilocox.Error (expected one saying {fragments})")


def differing_lists(rank, world):
    import dilocox
    params = list(model().named_parameters())
    if rank == 1:
        params.append(("extra", torch.nn.Parameter(torch.zeros(3))))
    return expect_error(lambda: dilocox.OuterLoop(params, local_steps=4, timeout=30), "number of tensors")


def differing_shapes(rank, world):
    import dilocox
    m = model() if rank == 0 else torch.nn.Sequential(torch.nn.Linear(8, 17), torch.nn.Linear(17, 4))
    return expect_error(lambda: dilocox.OuterLoop(m.named_parameters(), local_steps=4, timeout=30),
                        "different name or shape")


def integer_tensor(rank, world):
    import dilocox
    params = list(model().named_parameters())
    if rank == 0:
        params[1] = ("counts", torch.zeros(16, dtype=torch.int64))
    return expect_error(lambda: dilocox.OuterLoop(params, local_steps=4, timeout=30),
                        "rank 0", "'counts'", "float32 or bfloat16")


def unknown_method_and_knob(rank, world):
    import dilocox
    m = model()
    expect_error(lambda: dilocox.OuterLoop(m.named_parameters(), compressor="powersgd"), "unknown method", "dilocox")
    expect_error(lambda: dilocox.OuterLoop(m.named_parameters(), knobs={"rnak": 4}), "no knob 'rnak'")
    expect_error(lambda: dilocox.OuterLoop(m.named_parameters(), compressor="allreduce"), "runs every step")
    expect_error(lambda: dilocox.OuterLoop(m.named_parameters(), local_steps=0), "local_steps")
    expect_error(lambda: dilocox.OuterLoop(m.named_parameters(), rebase="sometimes"), "rebase", "keep")
    return "ok"


def replaced_parameter(rank, world):
    import dilocox
    m = model()
    loop = dilocox.OuterLoop(m.named_parameters(), local_steps=4, timeout=30)
    m[0].weight.data = torch.zeros(16, 8)
    expect_error(loop.step, "memory moved")
    return "ok"


def wrong_state(rank, world):
    import dilocox
    a = dilocox.OuterLoop(model().named_parameters(), compressor="diloco", local_steps=4, timeout=30)
    b = dilocox.OuterLoop(model().named_parameters(), compressor="dilocox", local_steps=4, timeout=30)
    expect_error(lambda: b.load_state_dict(a.state_dict()), "method 'diloco'")
    expect_error(lambda: b.load_state_dict({"format": "x"}), "not a")
    return "ok"


def train_steps(m, loop, steps, poison_at=None):
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    reports = []
    for step in range(steps):
        loss = m(torch.randn(4, 8)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == poison_at:
            with torch.no_grad():
                m[1].bias[0] = float("nan")
        reports.append(loop.step())
    return [r for r in reports if r is not None]


def different_start(rank, world):
    import dilocox
    m = model()
    if rank == 1:
        with torch.no_grad():
            m[0].weight[3, 2] += 1e-3
    loop = dilocox.OuterLoop(m.named_parameters(), local_steps=4, timeout=30)
    return expect_error(lambda: train_steps(m, loop, 8), "start from different weights", "'0.weight'")


def nan_replica_raises(rank, world):
    import dilocox
    m = model()
    loop = dilocox.OuterLoop(m.named_parameters(), local_steps=4, timeout=30, nonfinite="raise")
    return expect_error(lambda: train_steps(m, loop, 13, poison_at=5 if rank == 1 else None),
                        "replica 1", "NaN")


def nan_replica_dropped(rank, world):
    import dilocox
    m = model()
    warnings = []
    loop = dilocox.OuterLoop(m.named_parameters(), local_steps=4, timeout=30, log=warnings.append)
    reports = train_steps(m, loop, 24, poison_at=5 if rank == 1 else None)
    dropped = [s["dropped"] for r in reports for s in r["syncs"]]
    assert len(dropped) >= 3 and [[d["rank"] for d in x] for x in dropped if x] == [[1]], dropped
    assert any("replica 1 dropped" in w for w in warnings), warnings
    assert all(torch.isfinite(p).all() for p in m.parameters()), "the dropped replica was not reset"
    return warnings[-1]


def dead_peer(rank, world):
    import dilocox
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    loop = dilocox.OuterLoop(m.named_parameters(), local_steps=4, timeout=20)
    t0 = time.monotonic()
    try:
        for step in range(40):
            if step == 6:
                if rank == 1:
                    os._exit(3)  # dies mid-round, without a word
                t0 = time.monotonic()
            loss = m(torch.randn(4, 8)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            loop.step()
        loop.finish()
    except dilocox.Error as e:
        return time.monotonic() - t0, str(e)
    raise AssertionError("the survivor finished without an error")


def case(body):
    def run():
        got = harness.run(body)
        for rank in sorted(got):
            print(f"rank {rank}: {got[rank]}")
    return run


def stalled_peer(rank, world):
    import dilocox
    m = model()
    loop = dilocox.OuterLoop(m.named_parameters(), local_steps=4, timeout=5)
    if rank == 1:
        time.sleep(20)  # alive, silent: rank 0's first collective waits for it
    t0 = time.monotonic()
    try:
        train_steps(m, loop, 8)
        loop.finish()
    except dilocox.Error as e:
        return time.monotonic() - t0, str(e)
    raise AssertionError("finished without an error")


def stalled_peer_case():
    got = harness.run(stalled_peer)
    seconds, message = got[0]
    print(f"rank 0's error after {seconds:.1f} s: {message}")
    assert "timeout 5" in message and seconds < 15, "rank 0 did not time out on its stalled peer"


def dead_peer_case():
    got = harness.run(dead_peer, allow_exit=(1,))
    seconds, message = got[0]
    print(f"survivor's error after {seconds:.1f} s: {message}")
    assert seconds < 30, "the survivor waited past the timeout"


if __name__ == "__main__":
    harness.main({
        "differing_lists": case(differing_lists),
        "differing_shapes": case(differing_shapes),
        "integer_tensor": case(integer_tensor),
        "unknown_method_and_knob": case(unknown_method_and_knob),
        "replaced_parameter": case(replaced_parameter),
        "wrong_state": case(wrong_state),
        "different_start": case(different_start),
        "nan_replica_raises": case(nan_replica_raises),
        "nan_replica_dropped": case(nan_replica_dropped),
        "stalled_peer": stalled_peer_case,
        "dead_peer": dead_peer_case,
    })
