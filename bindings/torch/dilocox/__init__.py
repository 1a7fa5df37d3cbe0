"""dilocox for PyTorch: DiLoCoX's outer loop and its compressors around a torch model.

    import dilocox
    outer = dilocox.OuterLoop(model.named_parameters(), compressor="dilocox", local_steps=50)
    for batch in data:
        loss = model(batch); loss.backward(); opt.step(); opt.zero_grad()
        report = outer.step()          # a dict when syncs were applied, else None
    outer.finish()                     # every replica now holds the global parameters

The loop talks over a torch.distributed process group (gloo: CPU tensors), its own
unless one is given: reductions run on a background thread, so the group must not
carry other collectives meanwhile. Parameters are float32 (used in place) or bfloat16
(through an fp32 copy) CPU tensors, updated in place by the inner optimizer.
"""
import logging

import torch
import torch.distributed as dist

from . import _C
from ._C import Error, methods
from .ddp import LowRankState, lowrank_hook

__all__ = ["OuterLoop", "Error", "methods", "LowRankState", "lowrank_hook"]

_logger = logging.getLogger("dilocox")
_STATE_FORMAT = "dilocox.OuterLoop/1"


def _named(params):
    names, tensors = [], []
    for i, p in enumerate(params):
        if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
            name, t = p
        elif isinstance(p, torch.Tensor):
            name, t = f"param{i}", p
        else:
            raise Error(f"OuterLoop: item {i} of params is a {type(p).__name__}: "
                        "tensors (model.parameters()) or (name, tensor) pairs (model.named_parameters())")
        if not isinstance(t, torch.Tensor):
            raise Error(f"OuterLoop: parameter '{name}' is a {type(t).__name__}, not a tensor")
        names.append(name)
        tensors.append(t)
    return names, tensors


class OuterLoop:
    """The round protocol of DiLoCoX (or any method of dilocox.methods()) over torch parameters.

    params: model.parameters() or model.named_parameters() (names key each tensor's random
        streams and name it in errors; give names).
    group: a torch.distributed process group of the replicas; None: a new gloo group over
        every rank (torch.distributed must be initialized).
    compressor: a method name of dilocox.methods(); knobs: its settings by name.
    local_steps: H0, inner steps per round (adaptive methods move it). The other settings
        are the library's OuterLoopConfig; None keeps the method's own.
    timeout: seconds any collective may take before it is an error (a dead or stalled peer).
    log: a callable for the loop's warnings and events; default: the "dilocox" logger.
    nonfinite: a replica whose pseudo-gradient holds NaN/Inf is left out of the round's
        mean and restarts from the global parameters ("drop": said in the log and the
        report's "dropped"), or ends the run with a dilocox.Error on every rank ("raise").
    """

    def __init__(self, params, group=None, compressor="dilocox", local_steps=50, *, knobs=None,
                 max_local_steps=None, fragments=1, overlap=None, overlap_steps=None, rebase=None,
                 momentum_at=None, outer_lr=None, outer_momentum=None, momentum_storage="fp32",
                 timeout=300.0, seed=0, log=None, nonfinite="drop"):
        if nonfinite not in ("drop", "raise"):
            raise Error(f"OuterLoop: nonfinite must be 'drop' or 'raise', got {nonfinite!r}")
        names, tensors = _named(list(params))
        if group is None:
            if not dist.is_available() or not dist.is_initialized():
                raise Error("OuterLoop: torch.distributed is not initialized "
                            "(dist.init_process_group) and no group was given")
            group = dist.new_group(backend="gloo")
        self._log = log if log is not None else _logger.warning
        self._method = compressor
        self._nonfinite = nonfinite
        self._loop = _C.OuterLoop(names, tensors, group, compressor, dict(knobs or {}), local_steps,
                                  max_local_steps, fragments, overlap, overlap_steps, rebase, momentum_at,
                                  outer_lr, outer_momentum, momentum_storage, float(timeout), seed)
        self._names = names
        self._flush_log()

    def _flush_log(self):
        for line in self._loop.take_log():
            self._log(line)

    def step(self):
        """After each inner optimizer step. Returns None, or when syncs were applied:
        {"round", "local_steps", "wire_bytes", "syncs": [one dict per sync]}."""
        syncs = self._loop.step()
        self._flush_log()
        if not syncs:
            return None
        self._check_dropped(syncs)
        return {"round": syncs[-1]["round"], "local_steps": self._loop.local_steps,
                "wire_bytes": sum(s["wire_bytes"] for s in syncs), "syncs": syncs}

    def finish(self):
        """At the end, on every replica after the same steps: applies what is in flight,
        syncs the last progress, and sets the parameters to the global ones."""
        syncs = self._loop.finish()
        self._flush_log()
        self._check_dropped(syncs)
        return syncs

    def _check_dropped(self, syncs):
        # Every replica holds the same list of dropped ones, so with "raise" all raise.
        if self._nonfinite != "raise":
            return
        for s in syncs:
            for d in s["dropped"]:
                raise Error(f"OuterLoop: sync {s['sync']} (round {s['round']}): replica {d['rank']}'s "
                            f"tensor '{d['tensor']}' has NaN/Inf in its pseudo-gradient")

    def state_dict(self):
        """The loop's state (global parameters, outer momentum, compressor, schedule), for
        torch.save beside the model's and the inner optimizer's."""
        return {"format": _STATE_FORMAT, "method": self._method, "names": list(self._names),
                "state": self._loop.save_state()}

    def load_state_dict(self, state):
        """Into a loop built with the same parameters, method and settings, before its first step."""
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise Error(f"OuterLoop.load_state_dict: not a {_STATE_FORMAT} state")
        if state["method"] != self._method or state["names"] != self._names:
            raise Error(f"OuterLoop.load_state_dict: the state is of method '{state['method']}' over "
                        f"{len(state['names'])} tensors; this loop runs '{self._method}' over {len(self._names)}")
        self._loop.load_state(state["state"])

    def global_parameters(self):
        """The global parameters theta (identical on every replica), as new fp32 tensors."""
        return [self._loop.global_parameter(i) for i in range(len(self._names))]

    def memory(self):
        """The outer state held, in bytes by component."""
        return self._loop.memory()

    @property
    def local_steps(self):
        return self._loop.local_steps

    @property
    def round(self):
        return self._loop.round

    def describe(self):
        return self._loop.describe()
