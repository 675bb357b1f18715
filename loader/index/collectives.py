"""The process group collectives the index build makes: objects gathered or broadcast as
torch's ``all_gather_object`` and ``broadcast_object_list`` send them (pickled into byte
tensors, padded to the longest), each returning only once the group's own thread has let
go of the tensors.

Why not torch's: a process group runs each collective on a thread of its own (gloo's run
loop). When that thread drops the work's tensors, torch takes the GIL on it to release
their Python objects (``TensorImpl::decref_pyobject``), which makes that thread a Python
thread state, under the interpreter's thread-list lock. Under CPython 3.11 before 3.11.10
(python/cpython#112275), a fork at that moment leaves the child waiting for that lock
forever: a DataLoader forking its workers right after the dataset was built under
torchrun hung once in ~300-1,000 starts here (3 ranks of gloo, 2 workers each; the stuck worker
in ``os.fork``, in ``_PyThreadState_DeleteExcept``). torch's object collectives drop their
tensors when they return, so nothing tells when the group's thread is done with them;
here each collective's tensors are held, and it waits, the GIL released, until their
reference counts are back where they were before the collective (the group's thread
released them), for up to `RELEASE_S`.

Only CPU tensors (gloo's) are waited for: gloo's thread lets go within a millisecond of
the collective (measured on 2 cores: an object gather +0.1-0.6 ms over torch's 1.1-7.5 ms
at 2 and 4 ranks). NCCL's watchdog thread lets go of CUDA tensors on its own poll, up to
~100 ms later, a wait not measured here (no GPU machine): CUDA collectives return as
torch's do.
"""

from __future__ import annotations

import logging
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["RELEASE_S", "all_gather_object", "broadcast", "broadcast_object"]

log = logging.getLogger(__name__)

RELEASE_S = 0.25  # the longest a collective waits for the group's thread to let go (gloo
# lets go within a millisecond; a backend that keeps its work longer is waited for no more)


def _device() -> str:
    """The device object collectives send from, as torch's own choose it ("cuda" for
    NCCL, else "cpu")."""
    try:  # torch's (internal) rule, for every backend it knows
        from torch.distributed.distributed_c10d import _get_object_coll_device

        return str(_get_object_coll_device())
    except (ImportError, RuntimeError, ValueError):
        return "cuda" if dist.get_backend() == "nccl" else "cpu"


def _refs(tensors: Sequence[torch.Tensor]) -> list[int]:
    """The tensors' Python reference counts, each counted the same way every call (one
    more than the caller's while the group's thread holds the tensor)."""
    return [sys.getrefcount(t) for t in tensors]


def _run(collective: Callable[[], Any], tensors: Sequence[torch.Tensor]) -> None:
    """Run `collective` on `tensors`; return once the group's thread released them (CPU
    tensors; CUDA ones at once)."""
    before = _refs(tensors)
    collective()
    if any(t.device.type != "cpu" for t in tensors):
        return
    deadline = time.monotonic() + RELEASE_S
    while any(now > then for now, then in zip(_refs(tensors), before)):
        if time.monotonic() > deadline:
            log.debug("a collective's tensors were not let go within %.2f s", RELEASE_S)
            return
        time.sleep(0.0001)  # the GIL released: the group's thread may take it


def _tensor(obj: Any, device: str) -> torch.Tensor:
    data = bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    return torch.frombuffer(data, dtype=torch.uint8).to(device)


def _object(t: torch.Tensor, size: int) -> Any:
    return pickle.loads(t[:size].cpu().numpy().tobytes())


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank (``dist.all_gather_object``)."""
    world, device = dist.get_world_size(), _device()
    mine = _tensor(obj, device)
    size = torch.tensor([mine.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    _run(lambda: dist.all_gather(sizes, size), [size, *sizes])
    counts = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(counts), dtype=torch.uint8, device=device)
    padded[: mine.numel()] = mine
    parts = [torch.empty_like(padded) for _ in range(world)]
    _run(lambda: dist.all_gather(parts, padded), [padded, *parts])
    return [_object(p, n) for p, n in zip(parts, counts)]


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank (``dist.broadcast_object_list``); `src` gets its
    own object back, not a copy. Other ranks' `obj` is ignored."""
    device = _device()
    mine = _tensor(obj, device) if dist.get_rank() == src else None
    size = torch.tensor([0 if mine is None else mine.numel()], dtype=torch.int64, device=device)
    _run(lambda: dist.broadcast(size, src), [size])
    if mine is not None:
        _run(lambda: dist.broadcast(mine, src), [mine])
        return obj
    got = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _run(lambda: dist.broadcast(got, src), [got])
    return _object(got, got.numel())


def broadcast(tensor: torch.Tensor, src: int = 0) -> None:
    """``dist.broadcast`` of `tensor` from rank `src`, in place."""
    _run(lambda: dist.broadcast(tensor, src), [tensor])
