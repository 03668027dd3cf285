"""GPU proof for [export] §3: the Megatron model (read from the training run's torch_dist checkpoint)
and the exported HF model, forward on the same 32 prompts: max |Δlogit| and greedy next-token agreement,
in bf16 (HF SDPA and eager attention), in fp32 (the conversion itself, without bf16 kernel noise), in fp32 with
TF32 matmuls on both sides, and the HF model against itself with TF32 on (TF32's own rounding on these logits, which
TE's fp32 GEMMs always have).

usage: python tests/gpu/export_parity.py CHECKPOINT HF_DIR --name gpt_smoke --out parity.json"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import provenance, write_json  # noqa: E402


def prompts(tokenizer, count: int = 32, length: int = 128) -> list[list[int]]:
    """Half English, half Chinese documents from the bundled sample corpus, first `length` tokens."""
    from kaiyuan_recipes.data.sample_corpus import SOURCES, sample_texts

    out = []
    for name in SOURCES:
        texts = sorted(sample_texts(name), key=len, reverse=True)[: count // 2]  # the longest documents
        out += [tokenizer(t)["input_ids"][:length] for t in texts]
    return out


def megatron_logits(model, ids: torch.Tensor) -> torch.Tensor:
    position_ids = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    return model(input_ids=ids, position_ids=position_ids, attention_mask=None)


class RoutingRecorder:
    """For MoE models: the experts each token is sent to, per layer, on both sides (Megatron's TopKRouter
    returns a [tokens, experts] routing map, HF's Qwen3MoeTopKRouter the top-k indices). A near-tie between
    the k-th and (k+1)-th expert can flip on rounding alone; from that token on, the two models compute
    different (both correct) functions, so the conversion is judged on the positions before the first flip."""

    def __init__(self, megatron, hf):
        from megatron.core.transformer.moe.router import TopKRouter

        self.maps: dict[str, list[torch.Tensor]] = {"megatron": [], "hf": []}
        routers = [m for m in megatron.modules() if isinstance(m, TopKRouter)]
        gates = [layer.mlp.gate for layer in hf.model.layers if hasattr(getattr(layer, "mlp", None), "gate")]
        self.active = bool(routers) and len(routers) == len(gates)
        self.handles = []
        if self.active:
            self.handles += [r.register_forward_hook(self._megatron_hook) for r in routers]
            self.handles += [g.register_forward_hook(self._hf_hook) for g in gates]

    def _megatron_hook(self, _module, _inputs, out) -> None:  # (probs, routing_map [tokens, experts])
        self.maps["megatron"].append(out[1].bool())

    def _hf_hook(self, gate, _inputs, out) -> None:  # (logits, scores, top-k indices [tokens, k])
        self.maps["hf"].append(torch.zeros(out[2].shape[0], gate.num_experts, dtype=torch.bool,
                                           device=out[2].device).scatter_(1, out[2], True))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def first_flip(self) -> tuple[int | None, int]:
        """(first position whose experts differ in any layer or None, token-layer decisions that differ)."""
        first, differing = None, 0
        for a, b in zip(self.maps["megatron"], self.maps["hf"], strict=True):
            rows = (a != b).any(-1).nonzero().flatten()
            differing += rows.numel()
            if rows.numel():
                first = int(rows[0]) if first is None else min(first, int(rows[0]))
        self.maps = {"megatron": [], "hf": []}
        return first, differing


def compare(megatron, hf, batch: list[list[int]], vocab: int) -> dict:
    max_diff, agree_last, agree_all, total_all = 0.0, 0, 0, 0
    routing = RoutingRecorder(megatron, hf)
    clean_diff, flipped_prompts, differing, decisions = 0.0, 0, 0, 0
    with torch.no_grad():
        for ids in batch:
            x = torch.tensor([ids], device=next(hf.parameters()).device)
            a = megatron_logits(megatron, x)[..., :vocab].float()
            b = hf(x).logits[..., :vocab].float()
            max_diff = max(max_diff, (a - b).abs().max().item())
            greedy_a, greedy_b = a.argmax(-1), b.argmax(-1)
            agree_last += int(greedy_a[0, -1] == greedy_b[0, -1])
            agree_all += int((greedy_a == greedy_b).sum())
            total_all += greedy_a.numel()
            if routing.active:
                decisions += len(routing.maps["hf"]) * len(ids)
                first, n = routing.first_flip()
                differing += n
                flipped_prompts += int(first is not None)
                end = len(ids) if first is None else first
                if end:
                    clean_diff = max(clean_diff, (a[:, :end] - b[:, :end]).abs().max().item())
    routing.remove()
    result = {"max_abs_logit_diff": max_diff, "greedy_next_token_agreement": agree_last / len(batch),
              "greedy_agreement_all_positions": agree_all / total_all, "prompts": len(batch)}
    if routing.active:
        result["routing"] = {"token_layer_decisions": decisions, "decisions_differing": differing,
                             "prompts_with_a_flip": flipped_prompts,
                             "max_abs_logit_diff_before_first_flip": clean_diff}
    return result


HEADLINE_SETTING = "bf16_hf_sdpa"


def tf32_shift(hf, batch: list[list[int]], vocab: int) -> dict:
    """How far the same HF model's fp32 logits move when its matmuls run in TF32: TF32's own rounding here."""
    max_diff = 0.0
    with torch.no_grad():
        for ids in batch:
            x = torch.tensor([ids], device=next(hf.parameters()).device)
            exact = hf(x).logits[..., :vocab].float()
            torch.set_float32_matmul_precision("high")
            try:
                rounded = hf(x).logits[..., :vocab].float()
            finally:
                torch.set_float32_matmul_precision("highest")
            max_diff = max(max_diff, (exact - rounded).abs().max().item())
    return {"max_abs_logit_diff": max_diff, "prompts": len(batch)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("hf_dir", type=Path)
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", default=" ".join(sys.argv))
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kaiyuan_recipes import fastpath
    from kaiyuan_recipes.export.megatron_to_hf import (
        checkpoint_shape,
        ensure_single_process_group,
        newest_iteration_dir,
        rebuild_overrides,
    )

    fastpath.prepare_megatron_bridge()  # a fast-spec checkpoint names our layer spec
    from megatron.bridge.training.model_load_save import load_megatron_model

    ensure_single_process_group()
    tokenizer = AutoTokenizer.from_pretrained(str(args.hf_dir))
    batch = prompts(tokenizer)
    vocab = len(tokenizer)
    # rebuilt as the export rebuilds it: one rank, the training-step-only fields off (a TE run recorded
    # gradient_accumulation_fusion on, which outside training needs Apex or the training's stand-in)
    loaded = load_megatron_model(str(newest_iteration_dir(args.checkpoint)), use_cpu_init=True,
                                 mp_overrides=rebuild_overrides(checkpoint_shape(args.checkpoint)))
    megatron = (loaded[0] if isinstance(loaded, list) else loaded).cuda().to(torch.bfloat16).eval()
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(1234)  # the attention dropout region needs its RNG state, even in eval
    results = {}
    for attn in ("sdpa", "eager"):
        hf = AutoModelForCausalLM.from_pretrained(str(args.hf_dir), dtype=torch.bfloat16, attn_implementation=attn)
        results[f"bf16_hf_{attn}"] = compare(megatron, hf.cuda().eval(), batch, vocab)
        del hf
    megatron = megatron.float()
    hf = AutoModelForCausalLM.from_pretrained(str(args.hf_dir), dtype=torch.float32, attn_implementation="eager")
    results["fp32_hf_eager"] = compare(megatron, hf.cuda().eval(), batch, vocab)
    # The same with TF32 matmuls on both sides: the size of TF32's rounding on these logits, to set beside a spec
    # whose fp32 GEMMs run in TF32 regardless (TE's cuBLASLt path) -- is its fp32 gap that, or the export?
    torch.set_float32_matmul_precision("high")  # TF32
    results["fp32_tf32_hf_eager"] = compare(megatron, hf, batch, vocab)
    torch.set_float32_matmul_precision("highest")
    results["hf_fp32_vs_hf_tf32"] = tf32_shift(hf, batch, vocab)  # one-sided: both sides in TF32 partly cancel
    # the headline is the setting users get: transformers' default attention (SDPA), which `kaiyuan serve` and
    # `kaiyuan eval` load too; eager attention stays in by_setting
    headline = results[HEADLINE_SETTING]
    summary = {
        "model": args.name,
        "hf_class": type(hf).__name__,
        "headline_setting": HEADLINE_SETTING,
        "max_abs_logit_diff_bf16": headline["max_abs_logit_diff"],
        "greedy_next_token_agreement_bf16": headline["greedy_next_token_agreement"],
        "bf16_within_1e-2": headline["max_abs_logit_diff"] <= 1e-2,
        "max_abs_logit_diff_fp32": results["fp32_hf_eager"]["max_abs_logit_diff"],
        "max_abs_logit_diff_fp32_tf32_both_sides": results["fp32_tf32_hf_eager"]["max_abs_logit_diff"],
        "max_abs_logit_diff_hf_fp32_vs_hf_tf32": results["hf_fp32_vs_hf_tf32"]["max_abs_logit_diff"],
        **({"max_abs_logit_diff_fp32_before_first_routing_flip":
            results["fp32_hf_eager"]["routing"]["max_abs_logit_diff_before_first_flip"]}
           if "routing" in results["fp32_hf_eager"] else {}),
        "by_setting": results,
    }
    write_json(args.out, {**provenance(args.command), **summary})
    print({k: v for k, v in summary.items() if k != "by_setting"})
    for k, r in results.items():
        print(k, r)


if __name__ == "__main__":
    main()
