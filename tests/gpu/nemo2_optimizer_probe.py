"""The GPU probe of compat.nemo2_distributed_optimizer_saves: upstream megatron-core 0.15 (NeMo 2.7's), without our
workaround, on a host without Transformer Engine or Apex.

Builds a two-layer GPT (local spec) with megatron-core's DistributedDataParallel and optimizer, takes one Adam step,
and asks for the optimizer's sharded state dict the way NeMo's MegatronStrategy saves it (`dp_reshardable`), once with
the distributed optimizer and once with the plain one, then saves each with dist_checkpointing. The defect: with
torch's AdamW (what megatron-core builds without TE or Apex) the scalar `step` state fails the distributed
optimizer's shape assertion, `(torch.Size([]), 0, N)`. The probe exits 0 when what it saw agrees with what compat
decides (distributed saves ⇔ compat says so) and the plain optimizer saves; when upstream fixes the defect on such
a host, the distributed save succeeds while compat still says it cannot, and the probe fails: drop the workaround.

  .venv-nemo2/bin/python tests/gpu/nemo2_optimizer_probe.py --out gpu-results/nemo2_optimizer_probe.json"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import traceback

import torch


def build(distributed: bool):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, bf16=True,
                               params_dtype=torch.bfloat16, masked_softmax_fusion=False, bias_activation_fusion=False,
                               bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False)
    gpt = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=256,
                   max_sequence_length=64).cuda()
    # bf16 as Megatron trains it: Float16Module casts the whole model (torch's norms are built in fp32 otherwise;
    # without it the first GPU run failed with `expected mat1 and mat2 to have the same dtype`).
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=distributed), Float16Module(config, gpt))
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, bf16=True,
                                                       use_distributed_optimizer=distributed), [ddp])
    return ddp, optimizer


def one_step(ddp, optimizer) -> None:
    tokens = torch.randint(0, 256, (2, 64), device="cuda")
    positions = torch.arange(64, device="cuda").expand(2, 64)
    mask = ~torch.tril(torch.ones(64, 64, dtype=torch.bool, device="cuda")).view(1, 1, 64, 64)  # True: masked
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    ddp(tokens, positions, mask, labels=tokens).float().mean().backward()
    ddp.finish_grad_sync()
    optimizer.step()


def save(ddp, optimizer, directory: str) -> dict:
    from megatron.core import dist_checkpointing

    # What nemo.lightning's MegatronStrategy.sharded_state_dict_metadata gives a run with the distributed optimizer.
    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True,
                "distrib_optim_sharding_type": "dp_reshardable"}
    model_sd = ddp.module.sharded_state_dict(metadata=metadata)
    try:
        optim_sd = optimizer.sharded_state_dict(model_sd, metadata=metadata)
        dist_checkpointing.save({"model": model_sd, "optimizer": optim_sd}, directory)
    except AssertionError as e:
        arg = e.args[0] if e.args else None
        scalar_step = isinstance(arg, tuple) and len(arg) == 3 and arg[0] == torch.Size([])
        return {"saved": False, "scalar_step_assertion": scalar_step, "error": repr(e)[:300],
                "where": traceback.extract_tb(e.__traceback__)[-1].name}
    return {"saved": True, "files": sorted(os.listdir(directory))[:8]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")  # beside a NeMo run on the default port
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    import megatron.core
    from megatron.core import parallel_state
    from megatron.core.optimizer import Adam
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from kaiyuan_recipes import compat

    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1)
    result = {"megatron_core": megatron.core.__version__, "torch": torch.__version__,
              "host": socket.gethostname(), "gpu": torch.cuda.get_device_name(),
              "revision": os.environ.get("KAIYUAN_REVISION", "unknown"), "command": " ".join(sys.argv),
              "adam_is_torch_adamw": Adam is torch.optim.AdamW,
              "compat_says_distributed_optimizer_saves": compat.nemo2_distributed_optimizer_saves()}
    for name, distributed in (("distributed_optimizer", True), ("plain_optimizer", False)):
        ddp, optimizer = build(distributed)
        one_step(ddp, optimizer)
        with tempfile.TemporaryDirectory() as tmp:
            result[name] = save(ddp, optimizer, tmp)
    distributed = result["distributed_optimizer"]
    defect = not distributed["saved"] and distributed["scalar_step_assertion"]
    result["defect_present"] = defect
    result["compat_agrees"] = result["compat_says_distributed_optimizer_saves"] == distributed["saved"]
    result["ok"] = result["compat_agrees"] and result["plain_optimizer"]["saved"] and (
        distributed["saved"] or defect)  # a failure of another kind is not this defect
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result, indent=1))
    torch.distributed.destroy_process_group()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
