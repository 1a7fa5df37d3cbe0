"""A DDP communication hook: PowerSGD's algorithm on dilocox's projector, int8 or int4
factors on the wire, error feedback. A drop-in for torch's powerSGD_hook:

    state = dilocox.LowRankState(model, process_group=None, matrix_approximation_rank=4,
                                 start_powerSGD_iter=10)
    ddp_model.register_comm_hook(state, dilocox.lowrank_hook)

Until start_powerSGD_iter the bucket is averaged by a plain allreduce (as powerSGD_hook
does, so that DDP's bucket rebuild happens before any compressor state exists). The
hook reduces in the caller's thread and returns a completed future.
"""
import torch
import torch.distributed as dist

from . import _C
from ._C import Error

_STATE_FORMAT = "dilocox.LowRankState/1"


class LowRankState:
    """The hook's state. model: the module DDP wraps (the state, residual and Q, is kept
    per parameter, since DDP reorders its buckets after the first step and after a
    restart). PowerSGDState's knobs where they mean the same: matrix_approximation_rank,
    start_powerSGD_iter, min_compression_rate, use_error_feedback, warm_start (always on:
    the projector keeps Q), random_seed; and dilocox's: bits (the factors' width on the
    wire, 8 or 4) and timeout (seconds a collective may take before it is an error)."""

    def __init__(self, model, process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=1_000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True, random_seed=0,
                 bits=8, timeout=300.0):
        if not isinstance(model, torch.nn.Module):
            raise Error(f"LowRankState: model must be the torch.nn.Module DDP wraps, got {type(model).__name__}")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise Error("LowRankState: the model has no parameters that take gradients")
        self._index = {id(p): i for i, (_, p) in enumerate(named)}
        if not warm_start:
            raise Error("LowRankState: warm_start=False is not supported (the projector always reuses Q)")
        if start_powerSGD_iter < 0:
            raise Error("LowRankState: start_powerSGD_iter must be >= 0")
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.random_seed = random_seed
        self.bits = bits
        self.timeout = timeout
        self.iter = 0
        self.allreduce_bytes = 0  # what the plain-allreduce steps put on the wire (ring estimate)
        self._impl = _C.LowRankHook(self._group(), matrix_approximation_rank, bits, float(min_compression_rate),
                                    use_error_feedback, random_seed, float(timeout), [n for n, _ in named],
                                    [list(p.shape) for _, p in named])

    def _group(self):
        return self.process_group if self.process_group is not None else dist.group.WORLD

    @property
    def wire_bytes(self):
        """Bytes this rank put on the wire so far: the compressed steps' and the warm-up allreduces'."""
        return self._impl.wire_bytes + self.allreduce_bytes

    def describe(self):
        return self._impl.describe()

    def state_dict(self):
        return {"format": _STATE_FORMAT, "iter": self.iter, "allreduce_bytes": self.allreduce_bytes,
                "hook": self._impl.save_state()}

    def load_state_dict(self, state):
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise Error(f"LowRankState.load_state_dict: not a {_STATE_FORMAT} state")
        self._impl.load_state(state["hook"])
        self.iter = state["iter"]
        self.allreduce_bytes = state["allreduce_bytes"]


def lowrank_hook(state, bucket):
    """The DDP comm hook: the bucket's gradients averaged over the group, compressed."""
    buffer = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        if bucket.is_last():
            state.iter += 1
        group = state._group()
        world = group.size()
        state.allreduce_bytes += 2 * (world - 1) * buffer.numel() * buffer.element_size() // world
        buffer.div_(world)
        return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda f: f.value()[0])
    grads = bucket.gradients()
    try:
        index = [state._index[id(p)] for p in bucket.parameters()]
    except KeyError:
        raise Error("lowrank_hook: a bucket holds a parameter that is not the LowRankState's model's") from None
    order = sorted(range(len(grads)), key=index.__getitem__)
    state._impl.reduce([index[j] for j in order], [grads[j] for j in order])
    if any(g.data_ptr() < buffer.data_ptr() or
           g.data_ptr() >= buffer.data_ptr() + buffer.numel() * buffer.element_size() for g in grads):
        buffer.copy_(torch.cat([g.reshape(-1) for g in grads]))
    if bucket.is_last():
        state.iter += 1
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut
