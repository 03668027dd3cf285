"""Training throughput side by side in one GPU run, same batch and sequence length:
our fast spec (`kaiyuan.layer_spec=fast`), Megatron's local spec, a plain transformers loop (eager SDPA, random
tokens) and the same loop under torch.compile; the peers' own qwen3 1.7B trainers (peer_torchtitan.py:
`torchtitan` with its tied embeddings, `torchtitan_untied` with ours' untied ones, `torchtitan_selective_ac` with its
toml's activation checkpointing, for a GPU that does not hold the step without; peer_olmo_core.py: `olmo_core`)
on the token stream `ours` reads (token_stream.py), so their losses compare with ours'; on a host with Transformer
Engine also TE's spec (recipe_te, megatron_te, bridge_te, megatron_te_graph, megatron_te_chunked_loss) and
ours_without_te (the fast spec, TE hidden from it). tokens/s/GPU, model TFLOP/s, peak memory. Megatron's runs
report model TFLOP/s with Megatron's formula; the HF loops and the peers use the same FLOPs per token (taken from
the Megatron run of the same model in this process), so the columns compare (a peer's own figure stays under
own_tflops).

usage (GPU host): python benchmarks/train_throughput.py --models qwen3_1p7b gpt_smoke --out train_throughput.json
      [--impl-timeout 300]  (a slow implementation, e.g. HF's compile, records a timeout; the rest still run)
      (CPU smoke of the HF loop: --impls hf_eager --device cpu --tiny)
      peer rows: --impls ours torchtitan olmo_core --peer-pythonpath DIR... (where the peers' wheels are installed;
      prepended to the PYTHONPATH of the peers' processes only)
      --profile: the Megatron and peer rows each keep a PyTorch profiler trace of one step after their timed
      steps (peer_profile_report.py compares them)"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from megatron_rows import BATCH, megatron_overrides  # noqa: E402
from merge_results import with_ratios  # noqa: E402
from provenance import provenance, this_command, write_json  # noqa: E402

# Megatron variants: layer spec and extra overrides. `ours` is the recipe's defaults: the fast spec with the
# whole-step CUDA graph and fused weight-gradient accumulation (kaiyuan.cuda_graph / wgrad_fusion = auto).
# Not run by default (A/B of the fast spec's parts): ours_eager, neither (every kernel launched by the host);
# ours_eager_wgrad_fusion, the fusion alone; ours_graph_unfused, the graph alone; ours_full_logits, without the
# chunked cross-entropy; ours_cudnn_attention, SDPA's cuDNN kernels first; ours_torch_norm, torch's RMSNorm
# kernels instead of the compiled one.
# Megatron-LM's defaults with TE (fused RoPE and SwiGLU, Megatron's fused native cross-entropy; Megatron-LM rejects
# TE's). At 3e7174c it also set cross_entropy_fusion_impl=te: 2026-12-02_te_throughput.json's megatron_te row.
MEGATRON_TE_FUSIONS = ("model.apply_rope_fusion=true", "model.bias_activation_fusion=true",
                       "model.cross_entropy_loss_fusion=true", "model.cross_entropy_fusion_impl=native")
# The peer computes its logits whole, as Megatron-LM does (the recipe's `auto` puts our chunked loss on TE's spec).
MEGATRON_TE = (*MEGATRON_TE_FUSIONS, "kaiyuan.chunked_loss=false")
MEGATRON_IMPLS = {"ours": ("fast", ()), "megatron_local": ("local", ()),
                  "ours_eager": ("fast", ("kaiyuan.cuda_graph=false",)),
                  "ours_eager_wgrad_fusion": ("fast", ("kaiyuan.cuda_graph=false", "kaiyuan.wgrad_fusion=true")),
                  "ours_graph_unfused": ("fast", ("kaiyuan.wgrad_fusion=false",)),
                  "ours_full_logits": ("fast", ("kaiyuan.chunked_loss=false",)),
                  "ours_cudnn_attention": ("fast", ("kaiyuan.sdpa_backend=cudnn",)),
                  "ours_torch_norm": ("fast", ("kaiyuan.compiled_norm=false",)),
                  # Transformer Engine (a TE host): recipe_te is what `auto` trains there; megatron_te is TE's spec
                  # with Megatron-LM's fusions beside it, stated here so the peer stays fixed when the recipe's
                  # defaults move; bridge_te is Megatron-Bridge's defaults (RoPE and SwiGLU unfused);
                  # megatron_te_graph adds our whole-step CUDA graph, megatron_te_chunked_loss our chunked loss
                  # (since 4dc1ccc the same settings as recipe_te, kept so earlier files' rows keep their name).
                  "recipe_te": ("transformer_engine", ()),
                  "megatron_te": ("transformer_engine", MEGATRON_TE),
                  "bridge_te": ("transformer_engine", ("model.apply_rope_fusion=false",
                                                       "model.bias_activation_fusion=false",
                                                       "kaiyuan.chunked_loss=false")),
                  "megatron_te_graph": ("transformer_engine", (*MEGATRON_TE, "kaiyuan.cuda_graph=true")),
                  "megatron_te_chunked_loss": ("transformer_engine", (*MEGATRON_TE_FUSIONS,
                                                                      "kaiyuan.chunked_loss=true"))}
# A row run as another row with Transformer Engine hidden from its process (PYTHONPATH without the folders that
# hold it, as on the GPU host's /tmp/site-te): what the fast spec trains at on a TE host with TE out of the way,
# in the same call (with TE importable, the fast path hands gradient clipping to TE's kernels, and more of
# Megatron-Bridge's defaults follow TE's import).
WITHOUT_TE = {"ours_without_te": "ours", "megatron_local_without_te": "megatron_local"}
# A peer framework's own trainer, each row in its own process: the script under benchmarks/ and its arguments.
PEERS = {"torchtitan": ("peer_torchtitan.py", ()), "torchtitan_untied": ("peer_torchtitan.py", ("--untied",)),
         "torchtitan_selective_ac": ("peer_torchtitan.py", ("--ac", "selective")),
         "olmo_core": ("peer_olmo_core.py", ())}
PEER_MODELS = ("qwen3_1p7b",)  # the peers' configs are their qwen3 1.7B
TIMED_OUT = "timed out after"
# --profile: the same training process goes on past the timed steps (1..--steps, the first 3 untimed) to one step
# under the PyTorch profiler, --steps + PROFILE_AFTER, its profiler warm-up step between: no timed step runs with
# the profiler on, and no second start-up (model build, compile, graph capture) is paid for the trace. Megatron
# writes the trace when the step after it begins, so that row runs one step more.
PROFILE_AFTER = 2
# A profiled row's time box grows by this much (its tail's steps, the trace's export and compression), so that
# profiling never costs a row its timed figures: a peer's row reports only when its training ends.
PROFILE_EXTRA_S = 150
# --profile-step: each peer's own profiler (torchtitan's [profiling] job section, OLMo-core's ProfilerCallback)
PROFILED_PEERS = ("torchtitan", "torchtitan_untied", "torchtitan_selective_ac", "olmo_core")
TINY = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
            kv_channels=16)


def megatron_command(model: str, layer_spec: str, mbs: int, micro: int, seq: int, steps: int, root: Path,
                     nproc: int = 1, extra: tuple[str, ...] = ()) -> list[str]:
    """`kaiyuan train` on mock data, `micro` micro-batches of `mbs` per GPU (global batch grows with GPUs)."""
    return [sys.executable, "-m", "kaiyuan_recipes.cli.main", "train", model, f"--nproc-per-node={nproc}",
            *megatron_overrides(layer_spec, mbs, micro, seq, steps, root, nproc, extra)]


def without_te_env() -> dict[str, str]:
    """This process's environment with the PYTHONPATH folders that hold transformer_engine left out; an error if
    TE is still importable then (installed in site-packages, as in an NGC container: it cannot be hidden)."""
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths
                                                       if p and not (Path(p) / "transformer_engine").exists())}
    found = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('transformer_engine')"
                            " is not None)"], env=env, capture_output=True, text=True, check=True).stdout.strip()
    if found != "False":
        raise RuntimeError("transformer_engine is importable outside PYTHONPATH (site-packages): it cannot be hidden")
    return env


def run_bounded(command: list[str], timeout: float | None, env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """Run `command` in its own process group and return (exit code, output); past `timeout` the whole group
    (torchrun's ranks too, which would otherwise keep the GPU) gets SIGTERM, then SIGKILL, and the exit code is
    None with the output so far, ending in a line that says so."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    try:
        output = proc.communicate(timeout=timeout)[0]
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        pass
    output = ""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            output = proc.communicate(timeout=30)[0] or ""  # a retried communicate loses no output
            break
        except subprocess.TimeoutExpired:
            continue
    return None, f"{output}\n{TIMED_OUT} {timeout} s"


def profile_overrides(steps: int, profile_step: int) -> tuple[str, ...]:
    """The recipe's profiler on iteration `profile_step` (train_iters must reach profile_step + 1), with the
    learning-rate schedule of a `steps`-long run (Bridge ends the decay, and caps the warm-up, at train_iters
    unless lr_decay_iters says otherwise). Shapes recorded as torchtitan's profiler does, so the two traces cost
    the host the same."""
    return ("profile.enabled=true", f"profile.steps=[{profile_step},{profile_step}]", "profile.record_shapes=true",
            f"scheduler.lr_decay_iters={steps}")


def megatron_run(model: str, layer_spec: str, mbs: int, micro: int, seq: int, steps: int, nproc: int = 1,
                 extra: tuple[str, ...] = (), timeout: float | None = None, env: dict[str, str] | None = None,
                 profile_step: int | None = None) -> dict:
    """The median of the steady steps from the run's metrics.jsonl (`env`: the run's environment, else ours);
    with `profile_step`, the run goes on to that step under the profiler and the row names its trace."""
    from kaiyuan_recipes.config.run_layout import PROFILE_DIR, read_metrics

    root = Path(tempfile.mkdtemp(prefix="throughput-"))
    iters, extra = (profile_step + 1, (*extra, *profile_overrides(steps, profile_step))) if profile_step else (
        steps, extra)
    code, output = run_bounded(megatron_command(model, layer_spec, mbs, micro, seq, iters, root, nproc, extra),
                               timeout, env)
    (root / "launcher.log").write_text(output)  # the whole output stays with the run (the row has a summary)
    records = read_metrics(root / model / "run_state")
    steps_done = [r for r in records if r["event"] == "step"]
    settings = next((r.get("model") for r in records if r["event"] == "train_start"), None)
    steady = steps_done[3:steps]  # the profiled tail, when there is one, is not timed
    if not steady:
        return {"error": failure_summary(output), "log": str(root / "launcher.log")}
    row = {"tokens_per_s": statistics.median(r["tokens_per_s_per_gpu"] for r in steady),
           "tflops": statistics.median(r["model_tflops_per_gpu"] or 0 for r in steady),
           "peak_mem_gb": max(r["peak_mem_gb"] or 0 for r in steady),
           "timed_steps": len(steady),
           # every step's loss: same seed and mock data, so a variant (a CUDA graph) must train like `ours`
           "losses": [r.get("loss") for r in steps_done[:steps]],
           "model_settings": settings}  # the kernel settings it trained with (training/metrics.py)
    if code != 0:  # steady steps were measured before the run stopped: keep them, and say so
        row |= {"incomplete": f"{failure_summary(output, lines=1)}; {len(steps_done)} of {iters} steps done",
                "log": str(root / "launcher.log")}
    if profile_step:
        trace = root / model / PROFILE_DIR / "rank-0.json.gz"  # Megatron-Bridge's name for rank 0's trace
        row["profile"] = {"step": profile_step, "trace": str(trace)} if trace.exists() else {
            "step": profile_step, "error": f"no trace at {trace}", "log": str(root / "launcher.log")}
    return row


def failure_summary(output: str, lines: int = 12) -> str:
    """The last exception a rank raised, with the `lines` before it (kaiyuan_recipes.launch.failure); else the
    timeout line, or the output's end."""
    from kaiyuan_recipes.launch.failure import last_exception

    text = output.splitlines()
    if text and text[-1].startswith(TIMED_OUT):
        return text[-1]
    return last_exception(output, lines_before=lines - 1) or output[-1500:]


def hf_run_bounded(args: argparse.Namespace, model: str, impl: str) -> dict:
    """hf_run in a child process of this script, so a compile that outlasts --impl-timeout cannot take the
    rest of the benchmark with it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "one.json"
        command = [sys.executable, __file__, "--models", model, "--impls", impl, "--seq", str(args.seq),
                   "--steps", str(args.steps), "--device", args.device, "--out", str(out),
                   *(["--tiny"] if args.tiny else [])]
        code, output = run_bounded(command, args.impl_timeout)
        if code != 0 or not out.exists():
            return {"error": failure_summary(output)}
        return json.loads(out.read_text())["results"][model][impl]


def hf_run(model: str, compiled: bool, mbs: int, micro: int, seq: int, steps: int, device: str, tiny: bool) -> dict:
    """A plain transformers training loop: AdamW (fused on CUDA), bf16 weights, SDPA, grad accumulation."""
    from transformers import AutoModelForCausalLM

    from kaiyuan_recipes.models.hf_config import hf_config_for
    from kaiyuan_recipes.models.shape import ModelShape

    shape = dict(ModelShape.for_recipe(model).fields) | (TINY if tiny else {})
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    net = AutoModelForCausalLM.from_config(hf_config_for(shape), dtype=dtype, attn_implementation="sdpa").to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=device == "cuda")
    step_fn = torch.compile(net) if compiled else net
    vocab = shape["vocab_size"]
    times = []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        start = time.perf_counter()
        for _ in range(micro):
            ids = torch.randint(0, vocab, (mbs, seq), device=device)
            loss = step_fn(input_ids=ids, labels=ids).loss / micro
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    steady = times[3:] or times
    out = {"tokens_per_s": mbs * micro * seq / statistics.median(steady), "loss": float(loss) * micro,
           "timed_steps": len(steady)}
    if device == "cuda":
        out["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return out


def peer_run(args: argparse.Namespace, model: str, impl: str, streams: dict[str, Path]) -> dict:
    """A peer's trainer (PEERS) in its own process on the token stream `ours` reads, written once per model."""
    if model not in PEER_MODELS:
        return {"error": f"{impl} has no config for {model} (only {', '.join(PEER_MODELS)})"}
    if model not in streams:
        from token_stream import mock_stream

        mbs, micro = BATCH[model]
        iters = run_iters(args)  # ours' train_iters: they fix the mock data's shuffle
        stream = np.asarray(mock_stream(model, args.seq, iters,
                                        megatron_overrides("fast", mbs, micro, args.seq, iters,
                                                           Path(tempfile.mkdtemp(prefix="token-stream-")))))
        streams[model] = Path(tempfile.mkdtemp(prefix="peer-")) / f"{model}_stream.npy"
        np.save(streams[model], stream)
    script, extra = PEERS[impl]
    if args.profile and impl in PROFILED_PEERS:
        extra = (*extra, "--profile-step", str(profile_step(args)))
    out = streams[model].with_name(f"{impl}.json")
    command = [sys.executable, str(ROOT / "benchmarks" / script), "--stream", str(streams[model]),
               "--seq", str(args.seq), "--steps", str(args.steps), "--out", str(out), *extra]
    env = dict(os.environ)
    if args.peer_pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, args.peer_pythonpath), *filter(None, [env.get("PYTHONPATH")])])
    code, output = run_bounded(command, row_timeout(args, impl), env)
    log = args.out.with_name(f"{args.out.stem}_{model}_{impl}.log")  # the peer's whole output, beside the results
    log.write_text(output)
    if code != 0 or not out.exists():
        return {"error": failure_summary(output), "log": log.name}
    return json.loads(out.read_text()) | {"log": log.name}


def profile_step(args: argparse.Namespace) -> int | None:
    return args.steps + PROFILE_AFTER if args.profile else None


def row_timeout(args: argparse.Namespace, impl: str) -> float | None:
    """--impl-timeout, plus PROFILE_EXTRA_S for a row that goes on to a profiled step."""
    profiled = impl in MEGATRON_IMPLS or impl in WITHOUT_TE or impl in PROFILED_PEERS
    return args.impl_timeout + PROFILE_EXTRA_S if args.impl_timeout and args.profile and profiled else args.impl_timeout


def run_iters(args: argparse.Namespace) -> int:
    """Training steps of a Megatron row: --steps, or through the profiled step and the one that exports it."""
    return args.steps + PROFILE_AFTER + 1 if args.profile else args.steps


def keep_trace(args: argparse.Namespace, model: str, impl: str, row: dict) -> None:
    """A row's profiler trace copied beside the results file, under a name of its own; the row names the copy
    (relative to the results file)."""
    profile = row.get("profile") or {}
    if "trace" not in profile:
        return
    kept = args.out.with_name(f"{args.out.stem}_{model}_{impl}_trace.json.gz")
    source = Path(profile["trace"])
    if source.suffix == ".gz":
        shutil.copyfile(source, kept)
    else:  # a plain JSON trace: gzipped on the way (traces of a step run to tens of MB)
        import gzip

        with open(source, "rb") as fin, gzip.open(kept, "wb") as fout:
            shutil.copyfileobj(fin, fout)
    profile["trace"] = kept.name


def write_results(args: argparse.Namespace, results: dict) -> None:
    write_json(args.out, {**provenance(this_command()), "seq_length": args.seq,
                          **({"profiled_step": profile_step(args)} if args.profile else {}),
                          "batch": {m: {"micro_batch": BATCH[m][0], "micro_batches": BATCH[m][1]} for m in args.models},
                          "results": results})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["qwen3_1p7b", "gpt_smoke"])
    ap.add_argument("--impls", nargs="+", default=["ours", "megatron_local", "hf_eager", "hf_compile"],
                    choices=[*MEGATRON_IMPLS, *WITHOUT_TE, "hf_eager", "hf_compile", *PEERS])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model of the same vocabulary (CPU smoke)")
    ap.add_argument("--impl-timeout", type=float, default=None,
                    help="seconds per implementation (each then runs in its own process group); past it, "
                         "that row records the timeout and the others still run")
    ap.add_argument("--peer-pythonpath", type=Path, nargs="+",
                    help="folders of the peer rows' packages, in front of their processes' PYTHONPATH")
    ap.add_argument("--profile", action="store_true",
                    help=f"the Megatron and peer rows go on past --steps to one step under the PyTorch "
                         f"profiler (step --steps + {PROFILE_AFTER}; their --impl-timeout {PROFILE_EXTRA_S} s "
                         f"longer); its trace lands beside --out")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    results: dict = {}
    streams: dict[str, Path] = {}
    for model in args.models:
        mbs, micro = BATCH[model]
        seq = 64 if args.tiny else args.seq
        row = results.setdefault(model, {})
        for impl in args.impls:
            if impl in MEGATRON_IMPLS or impl in WITHOUT_TE:
                spec, extra = MEGATRON_IMPLS[WITHOUT_TE.get(impl, impl)]
                try:
                    env = without_te_env() if impl in WITHOUT_TE else None
                except RuntimeError as exc:
                    row[impl] = {"error": str(exc)}
                else:
                    row[impl] = megatron_run(model, spec, mbs, micro, seq, args.steps, extra=extra,
                                             timeout=row_timeout(args, impl), env=env,
                                             profile_step=profile_step(args))
            elif impl in PEERS:
                row[impl] = peer_run(args, model, impl, streams)
            elif args.impl_timeout:
                row[impl] = hf_run_bounded(args, model, impl)
            else:
                row[impl] = hf_run(model, impl == "hf_compile", mbs, micro, seq, args.steps, args.device, args.tiny)
            keep_trace(args, model, impl, row[impl])
            print(model, impl, row[impl], flush=True)
            write_results(args, results)  # after every run: a call cut short keeps what it measured
        flops_per_token = next((r["tflops"] * 1e12 / r["tokens_per_s"] for r in row.values()
                                if r.get("tflops") and r.get("tokens_per_s")), None)
        for r in row.values():
            if "tflops" not in r and flops_per_token and "tokens_per_s" in r:
                r["tflops"] = r["tokens_per_s"] * flops_per_token / 1e12
            if r.get("losses"):  # the same stream and optimizer settings: a peer that does not learn shows here
                r["final_loss"] = r["losses"][-1]
        with_ratios(row)
    write_results(args, results)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
