"""A cluster check under torchrun: every rank all-reduces its rank+1 and checks the sum, then prints one
line. `kaiyuan cluster check` runs it on every node; the launcher tests run it over real SSH.
--hold S keeps the job alive S seconds after the check (to exercise stop / node failure). Its ranks dump their
stacks on SIGUSR1 (kaiyuan stacks), as the training workers do: a check that hangs in NCCL says where."""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

from kaiyuan_recipes.launch.stacks import enable_stack_dumps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "x") != "" and _cuda()
    ap.add_argument("--backend", default="nccl" if gpus else "gloo")
    ap.add_argument("--hold", type=float, default=0.0)
    ap.add_argument("--tag", default="", help="echoed back verbatim (argument-passing checks)")
    args = ap.parse_args(argv)
    enable_stack_dumps()
    import torch
    import torch.distributed as dist

    dist.init_process_group(args.backend, timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    on_gpu = args.backend == "nccl"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if on_gpu else torch.device("cpu")
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    ok = value.item() == expected
    print(f"allreduce {'ok' if ok else 'FAILED'} rank={rank} world={world} sum={value.item():g} "
          f"expected={expected:g} host={os.uname().nodename} tag={args.tag}", flush=True)
    hold_after_the_check(args.hold)
    dist.destroy_process_group()
    return 0 if ok else 1


def hold_after_the_check(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    sys.exit(main())
