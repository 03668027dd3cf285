"""The torchrun command line for one node. Built as an argument list, never a shell string."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

ENTRY_MODULE = "kaiyuan_recipes.training.entry"


@dataclass
class TorchrunSpec:
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    python: str = field(default_factory=lambda: sys.executable)

    def argv(self, recipe: str, overrides: list[str]) -> list[str]:
        return self.command(["-m", ENTRY_MODULE, recipe, *overrides])

    def command(self, target: list[str]) -> list[str]:
        """torchrun running `target` (`-m module args…` or `script args…`) on this node."""
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError("nproc_per_node and nnodes must be at least 1")
        cmd = [self.python, "-m", "torch.distributed.run", f"--nproc-per-node={self.nproc_per_node}"]
        if self.nnodes == 1:
            cmd += ["--standalone"]
        else:
            cmd += [
                f"--nnodes={self.nnodes}",
                f"--node-rank={self.node_rank}",
                f"--master-addr={self.master_addr}",
                f"--master-port={self.master_port}",
            ]
        return cmd + list(target)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes
