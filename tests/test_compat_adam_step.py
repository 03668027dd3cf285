"""compat.restore_adam_step_per_parameter: resuming the distributed optimizer (torch AdamW, no Apex/TE) must
restore Adam's step. Upstream's own save and load code (DistributedOptimizer.state_dict,
get_parameter_state_dp_reshardable, load_state_dict) runs on a two-parameter shard around a real
torch.optim.AdamW; only the object's construction (which needs CUDA grad buffers) is skipped."""

import subprocess
import sys
import textwrap

import pytest

from kaiyuan_recipes import compat

pytestmark = pytest.mark.skipif(compat.transformer_engine_available(), reason="defect only shows without TE")

# Saved at step 13, loaded into a fresh optimizer the way Megatron-Bridge resumes (the template from
# sharded_state_dict(is_loading=True), persistent tensors replaced by the checkpoint's, non-persistent
# 'step' left as the template's), then one more step on both. Prints the step and whether the
# resumed shard matches the uninterrupted one bit for bit.
# A two-parameter shard of a DistributedOptimizer around a real torch AdamW, built without CUDA grad buffers.
SHARD = """
import types, torch
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer, Range

def shard(seed):
    torch.manual_seed(seed)
    model_params = [torch.nn.Parameter(torch.randn(n, dtype=torch.bfloat16)) for n in (64, 32)]
    mains = [torch.nn.Parameter(p.detach().float().clone()) for p in model_params]
    opt = DistributedOptimizer.__new__(DistributedOptimizer)
    opt.optimizer = torch.optim.AdamW(mains, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    # what megatron-core's get_param_groups puts in every group (0.18's load_state_dict requires them)
    opt.optimizer.param_groups[0].update(wd_mult=1.0, lr_mult=1.0, is_expert_parallel=False, is_decoupled_lr=False)
    opt.config = types.SimpleNamespace(fp16=False, use_precision_aware_optimizer_no_fp8_or_ds_fp8=False)
    opt.ddp_config = types.SimpleNamespace(use_megatron_fsdp=False)
    opt.grad_scaler = None
    opt.model_param_group_index_map = {p: (0, i) for i, p in enumerate(model_params)}
    ranges = [Range(0, 64), Range(64, 96)]
    opt.gbuf_ranges = [{torch.bfloat16: [{"param_map": {p: {"gbuf_local": r, "gbuf_world": r}
                                                       for p, r in zip(model_params, ranges)}}]}]
    opt.per_bucket_numel = opt.per_bucket_numel_unpadded = {}
    return opt, mains
"""

RESUME = SHARD + """
def step(opt, mains, gen):
    for main in mains:
        main.grad = torch.randn(main.shape, generator=gen)
    opt.optimizer.step()

def bucket(opt):
    return opt.get_parameter_state_dp_reshardable()[0][torch.bfloat16][0]

gen = torch.Generator().manual_seed(1)
ref, ref_mains = shard(0)
for _ in range(13):
    step(ref, ref_mains, gen)
common = ref.state_dict()
saved = [{k: v.detach().clone() for k, v in e.items() if k in ("param", "exp_avg", "exp_avg_sq")} for e in bucket(ref)]

new, new_mains = shard(5)
new._init_optimizer_states_with_dummy_values()  # what compat.init_optimizer_state_before_load does
new.load_state_dict(new.state_dict())             # what sharded_state_dict(is_loading=True) does
template = bucket(new)
for entry, tensors in zip(template, saved):
    for key in ("gbuf_local_start", "gbuf_local_end"):
        entry.pop(key)
    entry.update(tensors, padding=False)
with torch.no_grad():
    new.load_state_dict({**common, "param_state_sharding_type": "dp_reshardable",
                         "param_state": {0: {torch.bfloat16: [template]}}})
print("steps", [int(new.optimizer.state[m]["step"]) for m in new_mains])
for seed in (2, 3):
    step(ref, ref_mains, torch.Generator().manual_seed(seed))
    step(new, new_mains, torch.Generator().manual_seed(seed))
print("steps after 2", [int(new.optimizer.state[m]["step"]) for m in new_mains])
print("identical", all(torch.equal(a, b) for a, b in zip(ref_mains, new_mains)))
"""


def resume(with_compat: bool) -> str:
    prefix = "from kaiyuan_recipes import compat; compat.restore_adam_step_per_parameter()\n" if with_compat else ""
    probe = subprocess.run([sys.executable, "-c", prefix + textwrap.dedent(RESUME)], capture_output=True,
                           text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    return probe.stdout


def test_upstream_resume_still_resets_adam_step():
    out = resume(with_compat=False)
    assert "identical False" in out and "steps after 2 [15, 15]" not in out, (
        f"upstream resumes Adam exactly now ({out!r}): delete compat.restore_adam_step_per_parameter"
    )


def test_resumed_adam_continues_bit_for_bit_with_compat():
    out = resume(with_compat=True)
    assert "steps [13, 13]" in out
    assert "steps after 2 [15, 15]" in out
    assert "identical True" in out


def test_compat_apply_installs_the_step_fix():
    compat.apply()
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    assert DistributedOptimizer.load_state_dict._kaiyuan_patched
