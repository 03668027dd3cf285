"""MoE experts for hosts without Transformer Engine: Megatron's SequentialMLP (its parameters, init,
checkpoint layout and Megatron-Bridge's HF mapping unchanged), computed with one grouped GEMM per
projection over all local experts (torch's grouped_mm) instead of a Python loop of 2 x E small GEMMs: with
many small experts (laoyao_moe_2b has 64) the loop is kernel launches and host work, not arithmetic."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.experts import SequentialMLP

_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


class GroupedGemmSequentialMLP(SequentialMLP):
    """SequentialMLP whose forward stacks the experts' weights and runs fc1 and fc2 as grouped GEMMs. Cases
    it does not cover (biases, fp8/fp4, expert tensor parallelism, probabilities on the input, clamped or
    offset GLUs, one local expert) take SequentialMLP's own loop."""

    def _grouped(self) -> bool:
        c = self.config
        return (_grouped_mm is not None and self.num_local_experts > 1 and not c.add_bias_linear
                and not (c.fp8 or c.fp4) and not c.moe_apply_probs_on_input and self.tp_group.size() == 1
                and c.activation_func_clamp_value is None and not c.glu_linear_offset)

    def _run_expert_forward_pre_hooks(self) -> None:
        """The experts' modules are not called, their weights go to the grouped GEMMs; hooks that expect the
        calls still run, in SequentialMLP's order. Megatron DDP's overlapped parameter all-gather waits for a
        bucket in such a hook and starts the next one: skipped, a later step fails `param_gather_handle is
        None`."""
        for module in self.local_experts.modules():
            for key, hook in list(module._forward_pre_hooks.items()):
                if key in module._forward_pre_hooks_with_kwargs:
                    hook(module, (), {})
                else:
                    hook(module, ())

    def forward(self, permuted_local_hidden_states: torch.Tensor, tokens_per_expert: torch.Tensor,
                permuted_probs: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if not self._grouped():
            return super().forward(permuted_local_hidden_states, tokens_per_expert, permuted_probs)
        self._run_expert_forward_pre_hooks()
        x = permuted_local_hidden_states
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        offsets = torch.as_tensor(tokens_per_expert, device=x.device).cumsum(0).to(torch.int32)
        # [E, out, in] weights as [E, in, out] views: x @ Wᵀ per expert, no copies of the transposes
        fc1 = torch.stack([e.linear_fc1.weight for e in self.local_experts]).transpose(1, 2)
        fc2 = torch.stack([e.linear_fc2.weight for e in self.local_experts]).transpose(1, 2)
        h = _grouped_mm(x, fc1, offs=offsets)
        if self.config.gated_linear_unit:
            gate, up = torch.chunk(h, 2, dim=-1)
            h = self.config.activation_func(gate) * up
        else:
            h = self.config.activation_func(h)
        h = (h * permuted_probs.unsqueeze(-1)).to(x.dtype)  # as MLP does with its per-token scale
        return _grouped_mm(h, fc2, offs=offsets).reshape(*shape[:-1], -1), None


def with_grouped_experts(spec: Any) -> Any:
    """The same layer spec (or block spec of layer specs) with MoE experts built as GroupedGemmSequentialMLP;
    dense layers are left as they are."""
    import dataclasses
    from functools import partial

    from megatron.core.transformer.moe.moe_layer import MoELayer

    for layer in getattr(spec, "layer_specs", None) or [spec]:
        mlp = layer.submodules.mlp
        if getattr(mlp, "func", None) is not MoELayer:
            continue
        moe = mlp.keywords["submodules"]
        experts = partial(GroupedGemmSequentialMLP, *moe.experts.args, **moe.experts.keywords)
        layer.submodules.mlp = partial(mlp.func, *mlp.args,
                                       **{**mlp.keywords, "submodules": dataclasses.replace(moe, experts=experts)})
    return spec
