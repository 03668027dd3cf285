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
    expected = StaticDecoder(model, "cuda", "eager").greedy(prompts, 64, set(), stop_early=False)
    decoder = StaticDecoder(model, "cuda", mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = decoder.greedy(prompts, 64, set(), stop_early=False).clone()
        again = decoder.greedy(prompts, 64, set(), stop_early=False)  # the reused cache (and graph)
    fallbacks = [str(w.message) for w in caught if str(w.message).startswith("decode step")]
    assert decoder.mode == mode and not fallbacks, fallbacks
    assert torch.equal(first, expected) and torch.equal(again, expected)
    if mode == "graph":
        assert all(slot.captured is not None for slot in decoder.slots.values())
