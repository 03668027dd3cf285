"""The fast spec under Megatron's tensor parallelism, on the CPU: gpt_smoke's shape (tiny) built by our
provider in two gloo processes with TP=2 gives the loss and gradients that the same weights give with
TP=1 (megatron-core's CPU initialisation draws the full weights from the seed, then each rank keeps its
shard). SDPA attention sees each rank's heads; the chunked loss stands aside for the vocab-parallel output
layer, Megatron's vocab-parallel cross-entropy takes over. Sequence parallelism is not tested: without TE or
Apex the spec's norms are torch's, which megatron-core refuses under it (validate() says so up front)."""

import os

import torch
import torch.multiprocessing as mp
from conftest import free_port, megatron_forward_on_cpu, tiny_gpt_shape

SEQ, BATCH = 32, 2


def run_rank(rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from kaiyuan_recipes import compat

    compat.apply()
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    megatron_forward_on_cpu()
    from kaiyuan_recipes.fastpath.chunked_loss import install_chunked_loss
    from kaiyuan_recipes.fastpath.spec import SDPADotProductAttention
    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    shape = tiny_gpt_shape(num_layers=2, seq_length=SEQ, max_position_embeddings=SEQ)
    provider = build_provider(shape, "fast")
    provider.tensor_model_parallel_size = world
    torch.manual_seed(1234)
    model = provide_on_cpu(provider)
    install_chunked_loss([model])
    # Megatron's fused cross-entropy (what TP=2 gets) rounds the logits' gradient to bf16; compare exact to exact.
    model.config.cross_entropy_loss_fusion = False
    attention = model.decoder.layers[0].self_attention
    assert isinstance(attention.core_attention, SDPADotProductAttention)
    torch.manual_seed(0)
    tokens, labels = torch.randint(0, 512, (BATCH, SEQ)), torch.randint(0, 512, (BATCH, SEQ))
    loss = model(tokens, torch.arange(SEQ).expand(BATCH, SEQ), None, labels=labels)
    loss.mean().backward()
    results[(world, rank)] = {
        "loss": loss.detach(),
        "heads": attention.core_attention.num_attention_heads_per_partition,
        "fc2_grad": model.decoder.layers[1].mlp.linear_fc2.weight.grad.clone(),  # row-parallel: [h, ffn / tp]
        "norm_grad": model.decoder.final_layernorm.weight.grad.clone(),
    }
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def spawn(world: int) -> dict:
    manager = mp.Manager()
    results = manager.dict()
    mp.start_processes(run_rank, args=(world, free_port(), results), nprocs=world, start_method="spawn")
    return dict(results)


def test_fast_spec_under_tensor_parallelism_matches_tp1():
    tp1, tp2 = spawn(1), spawn(2)
    reference = tp1[(1, 0)]
    assert reference["heads"] == 4 and tp2[(2, 0)]["heads"] == tp2[(2, 1)]["heads"] == 2
    for rank in (0, 1):
        torch.testing.assert_close(tp2[(2, rank)]["loss"], reference["loss"], atol=1e-5, rtol=1e-5)
        shard = reference["fc2_grad"].chunk(2, dim=1)[rank]
        torch.testing.assert_close(tp2[(2, rank)]["fc2_grad"], shard, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(tp2[(2, rank)]["norm_grad"], reference["norm_grad"], atol=1e-5, rtol=1e-4)
