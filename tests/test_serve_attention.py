"""The server's decode attention (serve/attention.py): a decode step of a grouped-query model attends with each
KV head's query heads as its rows, never copying the window's keys and values to every head, and gives SDPA's
output; prefill and full forwards are transformers' SDPA unchanged."""

import pytest
import torch
from test_serve import tiny_model  # noqa: F401  (fixture)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_grouped_decode_attention_equals_sdpa_with_the_heads_repeated(groups):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from kaiyuan_recipes.serve.attention import grouped_sdpa_attention

    torch.manual_seed(0)
    batch, kv_heads, length, dim = 3, 2, 37, 16
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = groups, True
    query = torch.randn(batch, kv_heads * groups, 1, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    mask = (torch.arange(length)[None, :] <= torch.tensor([[5], [20], [36]]))[:, None, None, :]  # rows' own columns
    ours, _ = grouped_sdpa_attention(module, query, key, value, mask, scaling=dim ** -0.5)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=dim ** -0.5)
    assert ours.shape == theirs.shape == (batch, 1, kv_heads * groups, dim)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("implementation", ["ours", "sdpa"])
def test_decode_steps_copy_no_keys_or_values(tiny_model, monkeypatch, implementation):  # noqa: F811
    """transformers' SDPA path repeats the keys and values in every decode step (the control: the test can
    fail); the engine's attention never does, and its greedy tokens are the same."""
    import transformers.integrations.sdpa_attention as sdpa

    from kaiyuan_recipes.serve import attention
    from kaiyuan_recipes.serve.batch_decoder import Envelope
    from kaiyuan_recipes.serve.engine import GenerationEngine, Request

    if implementation == "sdpa":
        monkeypatch.setattr(attention, "register", lambda: "sdpa")
    engine = GenerationEngine(tiny_model, "cpu", Envelope(max_batch=4, max_seq_len=256, capture=False))
    try:
        assert engine.ready.wait(60)
        calls = []
        original = sdpa.repeat_kv
        monkeypatch.setattr(sdpa, "repeat_kv", lambda x, n: calls.append(n) or original(x, n))
        prompt = engine.encode("The quick brown fox")
        tokens = [c.token_ids for c in engine.generate([Request(prompt, 8, ignore_eos=True) for _ in range(2)])]
    finally:
        engine.close()
    layers = engine.model.config.num_hidden_layers
    if implementation == "ours":
        assert engine.model.config._attn_implementation == attention.ATTENTION and calls == []
    else:
        assert len(calls) == 2 * layers * 7  # keys and values, every layer, each of the 7 steps after the prefill
    assert tokens[0] == tokens[1] and len(tokens[0]) == 8
