"""A unit's membership of the torch.distributed process group: gradients, statistics and decisions in collectives.

Every method is one collective (or a fixed sequence of them) that every unit calls at the same point of its
loop, with tensors of the same shape: that is what keeps a process group from deadlocking. gloo carries them
on CPU; the group is joined from the ``env://`` variables torchrun (or the local launcher) sets.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


class UnitGroup:
    """This process's place in the group of units: rank, world size, node, and the collectives the loop uses."""

    def __init__(self, *, timeout_s: float) -> None:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import PrefixStore
        from torch.distributed.rendezvous import rendezvous

        self._dist = dist
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.node_rank = int(os.environ.get("GROUP_RANK", "0"))
        self.restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if not dist.is_initialized():
            timeout = timedelta(seconds=timeout_s)
            store, rank, world = next(rendezvous("env://", timeout=timeout))
            # torchrun keeps one store across restarts of the group: without a prefix per attempt, a restarted
            # unit can read the address a unit of the previous attempt published, and fail to connect to it.
            store = PrefixStore(f"strata-hybrid/attempt-{self.restart_count}/", store)
            dist.init_process_group(backend="gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.allreduce_s = 0.0
        """Seconds spent in gradient all-reduces since the last `take_allreduce_s`."""

    @property
    def is_leader(self) -> bool:
        """True on rank 0, the unit that talks to the rest of strata."""
        return self.rank == 0

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Give every unit rank 0's parameters and buffers (one flat broadcast)."""
        import torch

        tensors = [t for t in module.state_dict().values() if t.numel()]
        flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])
        self._dist.broadcast(flat, src=0)
        offset = 0
        with torch.no_grad():
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].reshape(t.shape).to(t.dtype))
                offset += t.numel()

    def average_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Replace every gradient by its mean over the units: one all-reduce of all gradients, flattened.

        A parameter without a gradient (an empty Discrete log-std) has none on every unit: the model and the
        loss are the same code everywhere, so the flattened layouts agree.
        """
        import time

        import torch

        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return
        started = time.perf_counter()
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._dist.all_reduce(flat, op=self._dist.ReduceOp.SUM)
        flat /= self.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        self.allreduce_s += time.perf_counter() - started

    def take_allreduce_s(self) -> float:
        """Seconds spent in gradient all-reduces since the last call."""
        spent, self.allreduce_s = self.allreduce_s, 0.0
        return spent

    def all_gather(self, vector: np.ndarray) -> np.ndarray:
        """Every unit's `vector` (float64, same length everywhere), stacked in rank order: ``[world, n]``."""
        import torch

        mine = torch.from_numpy(np.ascontiguousarray(vector, dtype=np.float64))
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        self._dist.all_gather(parts, mine)
        return torch.stack(parts).numpy()

    def broadcast(self, vector: np.ndarray) -> np.ndarray:
        """Rank 0's `vector` (int64), on every unit."""
        import torch

        data = torch.from_numpy(np.ascontiguousarray(vector, dtype=np.int64))
        self._dist.broadcast(data, src=0)
        return data.numpy()

    def gather_digests(self, digest: str) -> list[str]:
        """Every unit's state digest (the first 15 hex digits of a sha256), in rank order."""
        import torch

        mine = torch.tensor([int(digest[:15], 16)], dtype=torch.int64)
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        self._dist.all_gather(parts, mine)
        return [f"{int(p.item()):015x}" for p in parts]

    def close(self) -> None:
        """Leave the group."""
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


def state_digest(agent: torch.nn.Module, normalizer: Any) -> str:
    """sha256 (hex) of the policy a unit holds: every parameter's bytes and the normaliser's statistics."""
    h = hashlib.sha256()
    for name, tensor in agent.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    for part in (normalizer.mean, normalizer.var, np.float64(normalizer.count)):
        h.update(np.ascontiguousarray(part, dtype=np.float64).tobytes())
    return h.hexdigest()
