"""NeMo 2: `nemo llm pretrain --factory kaiyuan_qwen3 | kaiyuan_gpt_smoke` in the second environment
(`make env-nemo2`, .venv-nemo2), found through the `nemo_run.cli` entry point with no manual import;
overrides and a bad override; and the NeMo 2 model config compared field by field with the
Megatron-Bridge provider built from the same recipes/ file."""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NEMO2 = REPO / ".venv-nemo2" / "bin"


def nemo2(*args, timeout=600) -> subprocess.CompletedProcess:
    if not (NEMO2 / "nemo").exists():
        pytest.fail("the NeMo 2 environment is missing: `make env-nemo2` (make test creates it)")
    return subprocess.run([str(NEMO2 / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=dict(os.environ, HF_HUB_OFFLINE="1"))


def test_factory_dryrun_with_overrides():
    probe = nemo2("nemo", "llm", "pretrain", "--factory", "kaiyuan_qwen3", "trainer.max_steps=10",
                  "data.global_batch_size=16", "--dryrun", "-y")
    out = probe.stdout + probe.stderr
    assert probe.returncode == 0, out[-3000:]
    for fragment in ("Dry run for pretrain", "Qwen3Config(", "num_layers=28", "max_steps=10", "global_batch_size=16",
                     "PreTrainingDataModule(", "save_top_k=3", "monitor='step'", "mode='max'",
                     "WarmupHoldAnnealScheduler(", "save_optim_on_train_end=True",
                     # this host has neither TE nor Apex (compat.nemo2_distributed_optimizer_saves)
                     "use_distributed_optimizer=False"):
        assert fragment in out, fragment


def test_upstream_megatron_core_0_15_still_falls_back_to_torch_adamw_without_te_or_apex():
    """compat.nemo2_distributed_optimizer_saves's precondition: megatron-core 0.15.3 without TE or Apex builds torch's
    AdamW (a scalar 'step' per parameter), which its distributed optimizer fails to save (seen on the H200:
    benchmarks/results/archive/2026-12-03_nemo2_gpu_first_run.json, first_save_error; upstream's assertion is in
    DistributedOptimizer.sharded_param_state_dp_reshardable). This probe reads the precondition, not the save itself,
    which needs CUDA: tests/gpu/nemo2_optimizer_probe.py runs that on the GPU host."""
    probe = nemo2("python", "-c", "import torch, megatron.core.optimizer as o; print(o.Adam is torch.optim.AdamW)")
    assert probe.returncode == 0 and probe.stdout.strip().splitlines()[-1] == "True", probe.stderr[-2000:]


def test_gpt_smoke_factory_and_a_bad_override():
    probe = nemo2("nemo", "llm", "pretrain", "--factory", "kaiyuan_gpt_smoke", "--dryrun", "-y")
    assert probe.returncode == 0 and "GPTConfig(" in probe.stdout and "num_layers=12" in probe.stdout, (
        probe.stderr[-2000:])
    bad = nemo2("nemo", "llm", "pretrain", "--factory", "kaiyuan_qwen3", "trainer.max_stepz=10", "--dryrun", "-y")
    assert bad.returncode != 0 and "trainer.max_stepz" in bad.stdout + bad.stderr


# TransformerConfig fields that decide the math, compared beyond the ones model.yaml states.
EXTRA_FIELDS = ("rotary_percent", "apply_residual_connection_post_layernorm", "layernorm_zero_centered_gamma",
                "softmax_scale", "attention_softmax_in_fp32", "fp32_residual_connection", "add_bias_linear")

_DUMP = """
import json, sys, fiddle as fdl
from kaiyuan_recipes.nemo2.factories import model_config
cfg = fdl.build(model_config(sys.argv[1]))
fields = json.loads(sys.argv[2])
out = {}
for k in fields:
    v = getattr(cfg, k)
    out[k] = v.__name__ if callable(v) else v
print(json.dumps(out))
"""


@pytest.mark.parametrize("recipe", ["qwen3_1p7b", "gpt_smoke"])
def test_nemo2_model_config_matches_the_bridge_provider(recipe):
    from kaiyuan_recipes.config.recipe_tree import load_model_file
    from kaiyuan_recipes.models.shape import provider_for_recipe

    shape = load_model_file(recipe)
    fields = [k for k in shape if k not in ("max_position_embeddings",)] + list(EXTRA_FIELDS)
    probe = nemo2("python", "-c", _DUMP, recipe, json.dumps(fields))
    assert probe.returncode == 0, probe.stderr[-3000:]
    theirs = json.loads(probe.stdout.strip().splitlines()[-1])
    provider = provider_for_recipe(recipe)
    ours = {k: (getattr(provider, k).__name__ if callable(getattr(provider, k)) else getattr(provider, k))
            for k in fields}
    assert {k: v for k, v in ours.items() if theirs.get(k) != v} == {}, {k: theirs.get(k) for k in ours}


_ARCHLESS_IMPORT = """
import os, traceback
os.environ.pop("TORCH_CUDA_ARCH_LIST", None)  # undo what the .pth did: upstream as it ships
try:
    import megatron.core
    print("imported")
except IndexError as err:
    files = [f.filename.split("site-packages/")[-1] for f in traceback.extract_tb(err.__traceback__)]
    print("IndexError from", "megatron/core/inference/unified_memory.py" in files,
          files[-1].endswith("torch/utils/cpp_extension.py"))
"""


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="the defect shows on hosts without a GPU")
def test_upstream_megatron_core_0_15_import_still_breaks_without_a_gpu_arch():
    """compat.cpu_cuda_arch_list: `import megatron.core` (0.15) on a host without a GPU and no arch named still
    dies in unified_memory's CUDA build with torch's IndexError. Delete the workaround (and the .pth line in
    the Makefile) once this fails."""
    probe = nemo2("python", "-c", _ARCHLESS_IMPORT)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.strip().splitlines()[-1] == "IndexError from True True", probe.stdout[-1000:]
    started = nemo2("python", "-c", "import os; print(os.environ.get('TORCH_CUDA_ARCH_LIST'))")
    assert started.stdout.strip() == ("None" if os.path.exists("/proc/driver/nvidia/version") else "9.0")


def test_launch_executors_on_the_same_command_line():
    local = nemo2("nemo", "llm", "pretrain", "--factory", "kaiyuan_gpt_smoke", "run.executor=kaiyuan_local",
                  "run.executor.ntasks_per_node=2", "--dryrun", "-y")
    assert local.returncode == 0, local.stderr[-2000:]
    assert ("LocalExecutor(" in local.stdout and "launcher='torchrun'" in local.stdout
            and "ntasks_per_node=2" in local.stdout)
    ssh = nemo2("nemo", "llm", "pretrain", "--factory", "kaiyuan_gpt_smoke", "run.executor=kaiyuan_ssh",
                "run.executor.hosts=gpu1,gpu2", "run.executor.container=kaiyuan", "--dryrun", "-y")
    assert ssh.returncode == 0, ssh.stderr[-2000:]
    assert ("SSHMultiNodeExecutor(" in ssh.stdout and "hosts='gpu1,gpu2'" in ssh.stdout
            and "container='kaiyuan'" in ssh.stdout)


def test_the_slurm_executor_on_the_same_command_line():
    slurm = nemo2("nemo", "llm", "pretrain", "--factory", "kaiyuan_gpt_smoke", "run.executor=kaiyuan_slurm",
                  "run.executor.partition=batch", "run.executor.nodes=2", "run.executor.account=A",
                  "run.executor.signal=TERM@120", "--dryrun", "-y")
    assert slurm.returncode == 0, slurm.stderr[-2000:]
    out = " ".join(slurm.stdout.replace("│", " ").split())  # the rich table wraps lines
    for fragment in ("SlurmExecutor(", "account='A'", "partition='batch'", "nodes=2", "gpus_per_node=8",
                     "signal='TERM@120'", "job_details=PerNodeLogs(", "launcher='torchrun'"):
        assert fragment in out, fragment
