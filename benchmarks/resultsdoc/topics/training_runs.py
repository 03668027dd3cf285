"""Whole runs of the kaiyuan CLI: the user journey, stop and resume, curriculum phases, the training proofs."""

from __future__ import annotations

from typing import Callable

from resultsdoc.entries import Data
from resultsdoc.formatting import GIB, k1, mem, n0


def _steps(data: Data) -> dict[str, Data]:
    return {s["step"]: s.get("figure") or {} for s in data["steps"]}


def journey(d: Data) -> str:
    """Both parts, or the one the file holds (journey.sh runs one part per device call)."""
    s = _steps(d)
    ok = [step for step in d["steps"] if step["ok"]]
    versions = d.get("versions") or {}
    te = f", Transformer Engine {versions['transformer-engine']}" if versions.get("transformer-engine") else ""
    stack = (f"Stack {d['stack']}: megatron-bridge {versions.get('megatron-bridge')}, megatron-core "
             f"{versions.get('megatron-core')}, transformers {versions.get('transformers')}, torch "
             f"{versions.get('torch')}{te}. " if d.get("stack") and d["stack"] != "bridge" else "")
    verdict = s.get("doctor", {}).get("verdict")
    doctor = "" if not verdict else (
        f"`kaiyuan doctor` exits {s['doctor']['exit_code']}: " +
        (f"in the tested matrix ({verdict['stack']}). " if verdict["tested"] else
         f"not in the tested matrix ({verdict['stack']} but {'; '.join(verdict['mismatches'])}). "))
    parts = [_foreground(s) if "train" in s else "The foreground part is not in this file.",
             _detached(s) if "stop" in s else "The detached part is not in this file."]
    beside = (" It ran detached, partly beside other work on the same host (the file's command says what and how "
              "long): its wall times and tokens/s may not be a run's alone." if d.get("ran_beside_other_work") else "")
    return (f"{stack}Overrides: {d.get('overrides', 'none recorded')}. {len(ok)} of {len(d['steps'])} steps ok"
            f"{'' if d['all_ok'] else ' (NOT all ok)'}. {doctor}" + " ".join(parts) + beside)


def _foreground(s: dict[str, Data]) -> str:
    train = s["train"]
    eval_rows = [r.split("|") for r in s["eval"].get("table", [])[2:]]
    samples = next(int(r[3]) for r in eval_rows if len(r) > 3 and r[1].strip() == "overall")
    spec = train.get("layer_spec") or train.get("transformer_impl")  # transformer_impl: files before 2026-12-04
    spec = f" on `{spec}`" if spec else ""
    last20 = f", mean of the last 20 {train['mean_loss_last20']:.2f}" if "mean_loss_last20" in train else ""
    return (f"gpt_smoke trains {train['final_iteration']} steps{spec} (loss {train['first_loss']:.2f} → "
            f"{train['final_loss']:.2f}{last20}, {n0(train['tokens_per_s_last10'])} tokens/s over the last 10), "
            "`status` "
            f"says {s['status']['state']}, `export hf` takes {s['export']['export_s']} s, `serve` answers the "
            f"original `PUT /api` curl and an OpenAI completion ({s['openai_completion']['usage']['completion_tokens']}"
            f" tokens), `eval heldout` scores {samples} samples, `--phase 2` resumes at iteration "
            f"{s['phase2']['first_iteration']} and ends at {s['phase2']['final_iteration']}, and the phase-2 export "
            f"takes {s['export_phase2']['export_s']} s.")


def _detached(s: dict[str, Data]) -> str:
    stop, restart = s["stop"], s["restart"]
    return (f"Detached: `start`, a second `start` refused, `stop` with its checkpoint at iteration "
            f"{stop['last_checkpoint']} ({'a' if stop['sigkill_after_grace'] else 'no'} SIGKILL), `status` "
            f"{s['status_stopped']['state']} at {s['status_stopped']['iteration']}, a restart resumes at "
            f"{restart['train_starts_at'][-1]} and finishes at {s['status_finished']['iteration']}.")


def stop_resume(d: Data) -> str:
    stop = d["stop"]
    return (f"stopped with `kaiyuan stop` at a random step ({d['stop_requested_at_iteration']}), it saved its "
            f"checkpoint ({stop['last_checkpoint']}) with {'a' if stop['sigkill_after_grace'] else 'no'} SIGKILL; "
            f"restarted at {d['resumed_at_iteration']}, its next {len(d['compared_iterations'])} losses "
            f"{'equal' if d['identical_after_resume'] else 'differ from'} an uninterrupted same-seed run's (max "
            f"|Δ| {d['max_abs_loss_diff_after_resume']}; the control pair "
            f"{'identical' if d['control_identical'] else 'not identical'}).")


def phase(d: Data) -> str:
    one, two = d["launches"]
    return (f"gpt_smoke, phase 1 (English) steps {one['first_step']}–{one['last_step']} with its checkpoint at "
            f"{one['checkpoints_saved'][-1]}, phase 2 (Chinese) resumed at {two['started_at_iteration']} and ran to "
            f"{two['last_step']}; loss {d['first_loss']:.2f} → {d['last_loss']:.2f}, "
            f"{k1(d['tokens_per_s_per_gpu'])} tokens/s, {mem(d['peak_mem_gb'], GIB)}.")


def train_proof(what: str) -> Callable[[Data], str]:
    def text(d: Data) -> str:
        resumed = {True: "stop + resume at the right iteration", None: "one launch",
                   False: "resumed at the WRONG iteration"}[d["resumed_at_right_iteration"]]
        return (f"{what}{d['steps']} steps, {resumed}; loss {d['first_loss']:.2f} → {d['last_loss']:.2f}; "
                f"{k1(d['tokens_per_s_per_gpu'])} tokens/s/GPU, {d['model_tflops_per_gpu']:.1f} TFLOP/s, "
                f"{mem(d['peak_mem_gb'], GIB)}.")
    return text


def local_baseline(d: Data) -> str:
    b = d["baseline"]
    return (f" Baseline on the same GPU (`{b['source']}`): Megatron-Bridge's local spec, "
            f"{k1(b['megatron_bridge_local_spec_tokens_per_s'])} tokens/s.")


def nemo2(d: Data) -> str:
    """Issue #33: NeMo 2's `nemo llm pretrain` beside `kaiyuan train` (tests/gpu/nemo2_pretrain.sh)."""
    c, loss, q, e = d["checks"], d["loss_comparison"], d["qwen3_1p7b"], d["export"]
    resume = ("a restart resumed from the last checkpoint, optimizer state included, and trained on to step 110"
              if c["restart_resumed"] else
              f"the restart did NOT resume (`{d['resume']['error'][:90]}…`: the last save was weights-only)")
    (n1, n100), (kai1, kai100) = loss["nemo_first_last"], loss["kaiyuan_first_last"]
    gap = loss["last10_mean_nemo_minus_kaiyuan"]
    return (f"`nemo llm pretrain --factory kaiyuan_gpt_smoke` trained 100 steps on the sample corpus (loss "
            f"{n1:.2f} → {n100:.2f}; `kaiyuan train gpt_smoke` on the same "
            f"data, seed, batch and schedule {kai1:.2f} → {kai100:.2f}), "
            f"kept {len([n for n in d['nemo_checkpoints'] if not n.endswith('-last')])} checkpoints and wrote "
            f"TensorBoard; {resume}. Over the last 10 steps NeMo's loss is {gap:+.3f} "
            f"nats from kaiyuan's (tolerance ±{loss['tolerance_last10_mean_abs_nats']}; mean |Δ| over all "
            f"{loss['steps']} steps {loss['mean_abs_diff']:.3f}). The NeMo 2 checkpoint exported to HF (loss "
            f"{e['hf_loss_en_jargon_8x1024']:.2f} on 8 × 1024 corpus tokens) and `kaiyuan serve` answered `PUT /api` "
            f"and `/v1/completions`. qwen3_1p7b, local spec, batch {q['tokens_per_step'] // 4096} × 4096, median of "
            f"{q['nemo2']['steps_timed']} / {q['kaiyuan']['steps_timed']} steps after {q['warmup_steps_skipped']} "
            f"(NeMo / kaiyuan: NeMo's first step has no earlier step to time from): NeMo 2 "
            f"{n0(q['nemo2']['tokens_per_s'])} tokens/s, `kaiyuan train` {n0(q['kaiyuan']['tokens_per_s'])} "
            f"({q['kaiyuan_over_nemo2']:.3f}×).")


def nemo2_optimizer_probe(d: Data) -> str:
    """tests/gpu/nemo2_optimizer_probe.py: upstream's behaviour behind compat.nemo2_distributed_optimizer_saves."""
    dist, plain = d["distributed_optimizer"], d["plain_optimizer"]
    seen = (f"the distributed optimizer's save failed in `{dist['where']}` with `{dist['error']}` (torch AdamW's "
            "scalar `step`)" if not dist["saved"] else "the distributed optimizer's save worked")
    return (f"The probe of that workaround (rev {d['revision']}, megatron-core {d['megatron_core']}, torch "
            f"{d['torch']}, {d['gpu']}): one Adam step on a two-layer GPT, the optimizer's `dp_reshardable` state "
            f"saved as NeMo saves it: {seen}; the plain optimizer's save "
            f"{'worked' if plain['saved'] else 'failed'}. compat's choice (distributed optimizer saves: "
            f"{str(d['compat_says_distributed_optimizer_saves']).lower()}) "
            f"{'agrees' if d['compat_agrees'] else 'DISAGREES'} with what upstream did; the probe fails once "
            "upstream saves the scalar step.")

