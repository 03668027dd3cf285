"""The serving decoder's CUDA modes compute what its eager step computes (run through the device tool):
    python3 -m pytest -q -s tests/gpu/test_decode_gpu.py
A small random Qwen3 in fp32 with a 512-token vocabulary, so that greedy choices are not near-ties; prompts
of different lengths (left-padded by the decoder)."""

import warnings

import pytest
import torch
from kaiyuan_exporters.serving.decode import StaticDecoder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).cuda().eval()


@pytest.mark.parametrize("mode", ["graph", "reduce-overhead"])
def test_compiled_modes_match_eager(model, mode):
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (16, 9, 12, 16)]
    expected = StaticDecoder(model, "cuda", "eager").decode(prompts, 64, set(), stop_early=False)
    decoder = StaticDecoder(model, "cuda", mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = decoder.decode(prompts, 64, set(), stop_early=False).clone()
        again = decoder.decode(prompts, 64, set(), stop_early=False)  # the reused cache (and graph)
    fallbacks = [str(w.message) for w in caught if str(w.message).startswith("decode step")]
    assert decoder.mode == mode and not fallbacks, fallbacks
    assert torch.equal(first, expected) and torch.equal(again, expected)
    if mode == "graph":
        assert all("tokens" in slot.graphs for slot in decoder.slots.values())


def test_graph_mode_samples_as_eager(model):
    """Sampling in graph mode (the captured logits step, the draw outside the graph): the same seed gives
    eager's tokens (fp32 logits agree to ~1e-6, far from any draw's boundary), after the greedy graph of the
    same slot was used; a nucleus holding one token gives the greedy tokens."""
    from kaiyuan_exporters.serving.decode import Sampler

    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (16, 9, 12, 16)]
    sampler = Sampler(1.2, top_k=40, top_p=0.95)

    def sampled(decoder):
        torch.manual_seed(5)
        return decoder.decode(prompts, 48, set(), stop_early=False, sampler=sampler).clone()

    expected = sampled(StaticDecoder(model, "cuda", "eager"))
    decoder = StaticDecoder(model, "cuda", "graph")
    greedy = decoder.decode(prompts, 48, set(), stop_early=False).clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, again = sampled(decoder), sampled(decoder)
    assert decoder.mode == "graph" and not [w for w in caught if str(w.message).startswith("decode step")]
    assert all("logits" in slot.graphs for slot in decoder.slots.values())
    assert torch.equal(first, expected) and torch.equal(again, expected) and not torch.equal(first, greedy)
    torch.manual_seed(5)
    assert torch.equal(decoder.decode(prompts, 48, set(), stop_early=False, sampler=Sampler(1.0, top_p=1e-6)),
                       greedy)
