"""The in-training held-out scorer over two gloo ranks on the CPU, with the fast spec (gpt_smoke's blocks, tiny):
data parallel 2 (batches dealt over the ranks, an odd count so one rank repeats a batch and drops it; sums
all-reduced) and tensor parallel 2 (the output layer vocab-parallel, megatron-core's vocab-parallel cross-entropy;
the chunked loss stands aside) give every rank the figures one rank computes alone with the chunked loss."""

import json
import os

import torch
import torch.multiprocessing as mp
from conftest import free_port, megatron_forward_on_cpu, tiny_gpt_shape

SEQ = 48
ROWS = [{"dimension": "math", "prompt": f"Question: {a} + {a} = ?\nAnswer:", "completion": f" {2 * a}",
         "choices": [f" {2 * a}", f" {2 * a + 1}", f" {a}", " none of these"], "answer": 0} for a in range(5)] + [
    {"dimension": "code", "prompt": "import", "completion": " numpy as np"},
    {"dimension": "english_dialogue", "prompt": " ".join(["long"] * 70), "completion": " end."},
]


def build(tp: int):
    from kaiyuan_recipes.fastpath.chunked_loss import install_chunked_loss
    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    provider = build_provider(tiny_gpt_shape(num_layers=2, seq_length=SEQ, max_position_embeddings=SEQ,
                                             vocab_size=151936), "fast")
    provider.tensor_model_parallel_size = tp
    torch.manual_seed(1234)  # the full weights drawn from the seed, each TP rank keeping its shard
    model = provide_on_cpu(provider)
    install_chunked_loss([model])
    model.config.cross_entropy_loss_fusion = False
    return model.eval()


def run_rank(rank: int, world: int, port: int, path: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from kaiyuan_recipes import compat

    compat.apply()
    from megatron.core import parallel_state
    from transformers import AutoTokenizer

    from kaiyuan_recipes.data.heldout_scoring import encode_pair, hf_encoder, read_samples_strict, scoring_pairs
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir
    from kaiyuan_recipes.fastpath.chunked_loss import DeferredLogits
    from kaiyuan_recipes.training.heldout_eval import scorer

    megatron_forward_on_cpu()
    encode = hf_encoder(AutoTokenizer.from_pretrained(str(default_tokenizer_dir())))
    encoded = [encode_pair(encode, p.context, p.continuation, SEQ) for p in scoring_pairs(read_samples_strict(path))]
    budget = 3 * SEQ
    batches = scorer.plan_batches(encoded, budget, SEQ)
    out = {"batches": len(batches)}
    with torch.no_grad():
        parallel_state.initialize_model_parallel()  # data parallel over both ranks
        model = build(1)
        alone = torch.zeros(len(encoded), dtype=torch.float64)
        for idx, width in batches:  # every batch on this rank, nothing reduced
            alone[idx] = scorer.batch_logprob_sums(model, encoded, idx, width, moe=False)
        out["alone"] = alone.tolist()
        out["dp"] = scorer.score_encoded([model], encoded, budget, SEQ)
        parallel_state.destroy_model_parallel()

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
        model = build(world)
        assert isinstance(model.output_layer.forward(torch.zeros(1, 1, 64))[0], torch.Tensor)  # not deferred
        assert not any(isinstance(v, DeferredLogits) for v in vars(model).values())
        out["tp"] = scorer.score_encoded([model], encoded, budget, SEQ)
        out["vocab_shard"] = model.output_layer.weight.shape[0]
        parallel_state.destroy_model_parallel()
    results[rank] = out
    torch.distributed.destroy_process_group()


def test_data_and_tensor_parallel_scores_equal_one_ranks(tmp_path):
    path = tmp_path / "heldout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    results = mp.Manager().dict()
    mp.start_processes(run_rank, args=(2, free_port(), str(path), results), nprocs=2, start_method="spawn")
    r0, r1 = results[0], results[1]
    assert r0["batches"] % 2 == 1  # one rank has a batch fewer and runs a dropped one
    assert r0["vocab_shard"] == 151936 // 2
    alone = torch.tensor(r0["alone"])
    assert torch.equal(torch.tensor(r1["alone"]), alone)
    for key in ("dp", "tp"):
        for r in (r0, r1):
            torch.testing.assert_close(torch.tensor(r[key]), alone, rtol=1e-5, atol=1e-5)
