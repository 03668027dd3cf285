"""GPU: each local-spec setting in kaiyuan_recipes.compat is needed — reverting it to upstream's
default makes a forward+backward on CUDA without Transformer Engine fail. When one of these tests
fails, upstream has fixed that defect: drop the setting from compat.LOCAL_SPEC_SETTINGS.
Also checks that with all settings applied the same step succeeds (the control)."""

from __future__ import annotations

import pytest
import torch

from kaiyuan_recipes import compat

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module", autouse=True)
def _parallel(megatron_parallel):  # tests/conftest.py: NCCL process group + CUDA RNG tracker
    yield


# How each reverted setting fails on CUDA without TE / Apex: the defect itself, not any error.
EXPECTED_FAILURE = {
    # megatron-core's FusedScaleMaskSoftmax imports Apex's CUDA extension for the fused kernel
    "masked_softmax_fusion": (ModuleNotFoundError, r"No module named 'scaled_\w*softmax_cuda'"),
}


def _upstream_defaults() -> dict:
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    probe = GPTModelProvider(num_layers=2, hidden_size=128, num_attention_heads=4)
    return {k: getattr(probe, k) for k in compat.LOCAL_SPEC_SETTINGS}


def _build(revert: str | None):
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    provider = GPTModelProvider(
        num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=4, num_query_groups=2,
        vocab_size=1024, seq_length=64, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, position_embedding_type="rope",
        share_embeddings_and_output_weights=False, bf16=True, params_dtype=torch.bfloat16,
    )
    from megatron.core.process_groups_config import ProcessGroupCollection

    provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    compat.apply_local_spec_settings(provider)
    if revert is not None:
        setattr(provider, revert, _upstream_defaults()[revert])
    provider.finalize()
    return provider.provide().cuda()


def _step(model) -> float:
    tokens = torch.randint(0, 1024, (2, 64), device="cuda")
    positions = torch.arange(64, device="cuda").unsqueeze(0).expand(2, -1)
    mask = torch.tril(torch.ones(64, 64, device="cuda", dtype=torch.bool)).logical_not()[None, None]
    loss = model(tokens, positions, mask, labels=tokens).float().mean()
    loss.backward()
    torch.cuda.synchronize()
    return float(loss)


def test_control_all_settings_applied_trains():
    assert torch.isfinite(torch.tensor(_step(_build(None))))


@pytest.mark.parametrize("setting", sorted(compat.LOCAL_SPEC_SETTINGS))
def test_upstream_default_still_breaks(setting):
    default = _upstream_defaults()[setting]
    if default == compat.LOCAL_SPEC_SETTINGS[setting]:
        pytest.fail(
            f"{setting}: upstream's default is already {default!r}; "
            "pinning it is no longer a workaround — move it out of compat"
        )
    _step(_build(None))  # the harness itself works: a failure below is the reverted setting's
    kind, message = EXPECTED_FAILURE[setting]
    with pytest.raises(kind, match=message):
        _step(_build(setting))
