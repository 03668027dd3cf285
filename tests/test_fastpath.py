"""The fast path's one plan and one apply: every piece on or off with its reason, nothing installed into
megatron-core unless the plan says so, and a checkpoint that names the fast spec loads where prepared."""

import json
import subprocess
import sys
import textwrap

from kaiyuan_recipes.training.config import build_config

PIECES = ("fast_spec", "sdpa_backend", "compiled_norm", "swiglu_backward", "grouped_experts", "chunked_loss",
          "fused_adamw", "foreach_grad_clip", "cuda_graph", "wgrad_fusion")


def plan_of(tmp_path, recipe="gpt_smoke", *overrides):
    return build_config(recipe, [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock", *overrides])[1].fastpath


def test_every_piece_has_a_decision_and_a_reason(tmp_path):
    local = plan_of(tmp_path, "gpt_smoke", "kaiyuan.layer_spec=local")
    assert tuple(local.pieces) == PIECES
    assert all(not local.on(p) and "layer_spec=local" in local.pieces[p].reason
               for p in PIECES if p not in ("foreach_grad_clip",))
    fast = plan_of(tmp_path, "gpt_smoke", "kaiyuan.layer_spec=fast")
    assert all(fast.on(p) for p in PIECES if p != "grouped_experts")
    assert fast.pieces["grouped_experts"].reason == "dense model"
    knobs_off = plan_of(tmp_path, "gpt_smoke", "kaiyuan.layer_spec=fast", "kaiyuan.compiled_norm=false",
                        "kaiyuan.swiglu_backward=false", "kaiyuan.chunked_loss=false", "kaiyuan.fused_adamw=false",
                        "kaiyuan.foreach_grad_clip=false", "kaiyuan.cuda_graph=false")
    for piece in ("compiled_norm", "swiglu_backward", "chunked_loss", "fused_adamw", "foreach_grad_clip", "cuda_graph"):
        assert not knobs_off.on(piece) and f"kaiyuan.{piece}=false" in knobs_off.pieces[piece].reason
    assert knobs_off.pieces["wgrad_fusion"].reason == "auto: with the CUDA graph only"
    moe = plan_of(tmp_path, "laoyao_moe_2b", "kaiyuan.layer_spec=fast")
    assert moe.on("grouped_experts") and moe.pieces["cuda_graph"].reason == "auto: MoE (per-batch expert shapes)"
    assert not plan_of(tmp_path, "gpt_smoke", "kaiyuan.layer_spec=fast", "kaiyuan.deterministic=true").on("fused_adamw")
    # the chunked loss: auto on the fast and TE specs, asked for (true) on any spec, each with its reason
    assert fast.pieces["chunked_loss"].reason == "auto: logits never whole"
    assert local.pieces["chunked_loss"].reason == "auto: layer_spec=local"
    for spec in ("fast", "local"):
        asked = plan_of(tmp_path, "gpt_smoke", f"kaiyuan.layer_spec={spec}", "kaiyuan.chunked_loss=true")
        assert asked.on("chunked_loss") and asked.pieces["chunked_loss"].reason.startswith("kaiyuan.chunked_loss=true")


_PROBE = """
import json, sys
from kaiyuan_recipes.training.config import build_config
build_config("gpt_smoke", ["kaiyuan.data=mock", "kaiyuan.run_root=" + sys.argv[1], *sys.argv[2:]])
from megatron.core import utils
from megatron.core.fusions import fused_bias_swiglu
from megatron.core.optimizer import clip_grads
from megatron.core.tensor_parallel import layers
from kaiyuan_recipes.fastpath import swiglu_backward
print(json.dumps({"swiglu_backward": fused_bias_swiglu.SwiGLUFunction.backward is swiglu_backward._backward,
                  "foreach_grad_clip": clip_grads.l2_norm_impl is not utils.local_multi_tensor_l2_norm,
                  "wgrad_fusion": bool(layers._grad_accum_fusion_available)}))
"""


def installed_after_build(tmp_path, *overrides) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_PROBE), str(tmp_path), *overrides],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_auto_puts_the_chunked_loss_on_te_s_spec_and_not_on_the_local_spec(tmp_path):
    # TE does not import on a CPU host, so the config is the fast spec's and the decision is asked for each spec
    import dataclasses

    from kaiyuan_recipes.fastpath.decisions import _chunked_loss

    cfg, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock",
                                          "kaiyuan.layer_spec=fast"])
    said = {spec: _chunked_loss(cfg, dataclasses.replace(run, layer_spec=spec))
            for spec in ("fast", "transformer_engine", "local")}
    assert said["fast"].on and said["fast"].reason == "auto: logits never whole"
    assert said["transformer_engine"].on and said["transformer_engine"].reason == "auto: logits never whole"
    assert not said["local"].on and said["local"].reason == "auto: layer_spec=local"
    cfg.model.tensor_model_parallel_size = 2  # TP stands it aside on TE's spec too
    te_tp2 = _chunked_loss(cfg, dataclasses.replace(run, layer_spec="transformer_engine"))
    assert not te_tp2.on and te_tp2.reason.startswith("auto: tensor parallel")


def test_megatron_core_is_patched_only_where_the_plan_says(tmp_path):
    """Importing megatron.bridge and building a config patch nothing of megatron-core's that the plan left off
    (in a fresh process each: these patches are process-wide)."""
    assert installed_after_build(tmp_path, "kaiyuan.layer_spec=local", "kaiyuan.foreach_grad_clip=false") == {
        "swiglu_backward": False, "foreach_grad_clip": False, "wgrad_fusion": False}
    assert installed_after_build(tmp_path, "kaiyuan.layer_spec=local") == {
        "swiglu_backward": False, "foreach_grad_clip": True, "wgrad_fusion": False}
    assert installed_after_build(tmp_path, "kaiyuan.layer_spec=fast") == {
        "swiglu_backward": True, "foreach_grad_clip": True, "wgrad_fusion": True}


def test_a_checkpoints_fast_spec_target_instantiates_after_prepare_megatron_bridge():
    """run_config.yaml names the fast spec's function (kaiyuan_recipes.fastpath.spec.fast_layer_spec); Megatron-Bridge
    instantiates only allowlisted modules, so upstream's import alone (compat's) refuses it and
    fastpath.prepare_megatron_bridge, the entry point of export and serving, lets it resolve. A fresh interpreter:
    the allowlist is process state."""
    probe = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from kaiyuan_recipes import compat, fastpath
        compat.import_megatron_bridge()
        from megatron.bridge.utils.instantiate_utils import instantiate
        from kaiyuan_recipes.fastpath.spec import fast_layer_spec
        target = {"_target_": "kaiyuan_recipes.fastpath.spec.fast_layer_spec", "_call_": False}
        try:
            instantiate(target)
            print("compat alone: resolved")
        except Exception as err:
            print("compat alone: refused", type(err).__name__)
        fastpath.prepare_megatron_bridge()
        print("after prepare:", instantiate(target) is fast_layer_spec)
        # checkpoints saved before the fast path had its own package name its old module
        old = {"_target_": "kaiyuan_recipes.models.fast_spec.fast_layer_spec", "_call_": False}
        print("old name:", instantiate(old) is fast_layer_spec)
        """)], capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    lines = [line for line in probe.stdout.splitlines()
             if line.startswith(("compat alone:", "after prepare:", "old name:"))]
    assert len(lines) == 3 and lines[0].startswith("compat alone: refused"), probe.stdout[-3000:]
    assert lines[1] == "after prepare: True", lines
    assert lines[2] == "old name: True", lines
