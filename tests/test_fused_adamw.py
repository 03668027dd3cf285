"""The fast path's fused optimizer step (kaiyuan_recipes/training/fused_adamw.py) on a real torch AdamW,
wrapped the way Megatron wraps it: same updates as the foreach step it replaces, one kernel (PyTorch's
fused AdamW runs on the CPU too), step counters per parameter, chained (MoE) optimizers covered."""

import types

import torch

from kaiyuan_recipes.fastpath.fused_adamw import fuse_adamw


def adamw(seed: int = 0) -> torch.optim.AdamW:
    torch.manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(n)) for n in (64, 33)]
    return torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}],
                             lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)


def run(opt: torch.optim.AdamW, steps: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    params = [p for g in opt.param_groups for p in g["params"]]
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


def test_fused_step_matches_foreach_after_switching_mid_run():
    ref, fused = adamw(), adamw()
    run(ref, 3), run(fused, 3)
    megatron_like = types.SimpleNamespace(optimizer=fused)
    assert fuse_adamw(megatron_like) == 2
    assert all(g["fused"] and not g["foreach"] for g in fused.param_groups)
    assert fuse_adamw(megatron_like) == 0  # idempotent
    run(ref, 5, seed=2), run(fused, 5, seed=2)
    for a, b in zip((p for g in ref.param_groups for p in g["params"]),
                    (p for g in fused.param_groups for p in g["params"])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    steps = [fused.state[p]["step"] for g in fused.param_groups for p in g["params"]]
    assert [float(s) for s in steps] == [8.0, 8.0]
    assert steps[0] is not steps[1]


def test_chained_optimizers_and_other_optimizers():
    dense, expert = adamw(), adamw(1)
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    chained = types.SimpleNamespace(
        chained_optimizers=[types.SimpleNamespace(optimizer=o) for o in (dense, expert, sgd)])
    assert fuse_adamw(chained) == 4
    assert "fused" not in sgd.param_groups[0] or not sgd.param_groups[0].get("fused")


def test_only_fast_path_runs_that_need_not_be_deterministic_use_it(tmp_path):
    from kaiyuan_recipes.training.config import build_config

    def run(*knobs):
        return build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", *knobs])[1].fastpath.on("fused_adamw")

    assert run("kaiyuan.layer_spec=fast")
    assert not run("kaiyuan.layer_spec=fast", "kaiyuan.deterministic=true")
    assert not run("kaiyuan.layer_spec=local")
    assert not run("kaiyuan.layer_spec=fast", "kaiyuan.fused_adamw=false")  # the A/B knob


def test_it_is_off_where_megatron_core_steps_te_or_apex_fused_adam(tmp_path, monkeypatch):
    # With TE or Apex importable megatron-core binds optimizer.Adam to their FusedAdam at import, which the
    # callback cannot switch: the plan says so instead of claiming one kernel.
    from megatron.core import optimizer

    from kaiyuan_recipes.fastpath.decisions import Piece
    from kaiyuan_recipes.training.config import build_config

    def piece(*overrides):
        return build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.layer_spec=fast", *overrides])[1] \
            .fastpath.pieces["fused_adamw"]

    assert optimizer.Adam is torch.optim.AdamW and piece().on  # this host: no TE, no Apex
    # nor where upstream builds no torch Adam on the GPU: another optimizer, or its CPU-offload hybrid
    assert piece("optimizer.optimizer=sgd") == Piece(False, "optimizer=sgd")
    assert piece("optimizer.optimizer_cpu_offload=true") == Piece(False, "optimizer CPU offload")

    class FusedAdam(torch.optim.Optimizer):  # TE's and Apex's derive from torch.optim.Optimizer, not Adam
        pass

    monkeypatch.setattr(optimizer, "Adam", FusedAdam)
    assert piece() == Piece(False, "TE/Apex FusedAdam")


def test_megatron_fsdp_dtensor_params_are_left_alone(megatron_parallel):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    param = torch.nn.Parameter(distribute_tensor(torch.randn(8), mesh, [Shard(0)]))
    opt = torch.optim.AdamW([param], lr=1e-2)
    assert fuse_adamw(types.SimpleNamespace(optimizer=opt)) == 0
    assert not opt.param_groups[0].get("fused")
