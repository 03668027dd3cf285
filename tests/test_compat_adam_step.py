"""compat.keep_restored_adam_step: resuming the distributed optimizer (torch AdamW, no Apex/TE) must
restore Adam's step. Upstream's own save and load code (DistributedOptimizer.state_dict,
get_parameter_state_dp_reshardable, load_state_dict) runs on a one-parameter shard around a real
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
RESUME = """
import types, torch
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer, Range

def shard(seed):
    torch.manual_seed(seed)
    model_param = torch.nn.Parameter(torch.randn(64, dtype=torch.bfloat16))
    main = torch.nn.Parameter(model_param.detach().float().clone())
    opt = DistributedOptimizer.__new__(DistributedOptimizer)
    opt.optimizer = torch.optim.AdamW([main], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    opt.config = types.SimpleNamespace(fp16=False, use_precision_aware_optimizer_no_fp8_or_ds_fp8=False)
    opt.ddp_config = types.SimpleNamespace(use_megatron_fsdp=False)
    opt.grad_scaler = None
    opt.model_param_group_index_map = {model_param: (0, 0)}
    opt.gbuf_ranges = [{torch.bfloat16: [{"param_map": {model_param: {"gbuf_local": Range(0, 64),
                                                                       "gbuf_world": Range(0, 64)}}}]}]
    opt.per_bucket_numel = opt.per_bucket_numel_unpadded = {}
    return opt, main

def step(opt, main, gen):
    main.grad = torch.randn(main.shape, generator=gen)
    opt.optimizer.step()

def entry(opt):
    return opt.get_parameter_state_dp_reshardable()[0][torch.bfloat16][0][0]

gen = torch.Generator().manual_seed(1)
ref, ref_main = shard(0)
for _ in range(13):
    step(ref, ref_main, gen)
common = ref.state_dict()
saved = {k: v.detach().clone() for k, v in entry(ref).items() if k in ("param", "exp_avg", "exp_avg_sq")}

new, new_main = shard(5)
new._init_optimizer_states_with_dummy_values()  # what compat.init_optimizer_state_before_load does
new.load_state_dict(new.state_dict())             # what sharded_state_dict(is_loading=True) does
template = entry(new)
for key in ("gbuf_local_start", "gbuf_local_end"):
    template.pop(key)
template.update(saved, padding=False)
with torch.no_grad():
    new.load_state_dict({**common, "param_state_sharding_type": "dp_reshardable",
                         "param_state": {0: {torch.bfloat16: [[template]]}}})
print("step", int(new.optimizer.state[new_main]["step"]))
step(ref, ref_main, torch.Generator().manual_seed(2))
step(new, new_main, torch.Generator().manual_seed(2))
print("identical", torch.equal(ref_main, new_main))
"""


def resume(with_compat: bool) -> str:
    prefix = "from kaiyuan_recipes import compat; compat.keep_restored_adam_step()\n" if with_compat else ""
    probe = subprocess.run([sys.executable, "-c", prefix + textwrap.dedent(RESUME)], capture_output=True,
                           text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    return probe.stdout


def test_upstream_resume_still_resets_adam_step():
    out = resume(with_compat=False)
    assert "step 1\n" in out and "identical False" in out, (
        f"upstream restores Adam's step on resume now ({out!r}): delete compat.keep_restored_adam_step"
    )


def test_resumed_adam_continues_bit_for_bit_with_compat():
    out = resume(with_compat=True)
    assert "step 13\n" in out
    assert "identical True" in out


def test_compat_apply_installs_the_step_fix():
    compat.apply()
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    assert DistributedOptimizer._set_main_param_and_optimizer_states._kaiyuan_patched
