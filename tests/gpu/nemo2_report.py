"""The NeMo 2 result file and plot from nemo2_pretrain.sh's parts (on any host, once the parts have run):

  tar xzf nemo2_PART.tgz   (each part, into DIR: DIR/logs_nemo, logs_resume, logs_kaiyuan, logs_export, logs_qwen;
                            nemo2_optimizer_probe.json beside them where the probe ran)
  python tests/gpu/nemo2_report.py DIR --rev REV --commands FILE --out benchmarks/results/DATE_nemo2_gpu.json

The loss curves of `nemo llm pretrain --factory kaiyuan_gpt_smoke` and `kaiyuan train gpt_smoke` step by step (NeMo's
TensorBoard steps count from 0, Megatron's iterations from 1), the checkpoints kept, the resume, the NeMo 2
checkpoint's export and serving, and both sides' qwen3_1p7b tokens/s. The PNG goes beside --out."""

from __future__ import annotations

import argparse
import json
import socket
import statistics
from datetime import date
from pathlib import Path

# The stated tolerance of item 2: the mean |loss difference| over the last 10 of the 100 steps, in nats. Both sides
# draw the same samples (one cache, one seed) but not the same initial weights (NeMo and Megatron-Bridge seed their
# initialisation differently) and NeMo's warmup / decay run one step apart from Megatron's scheduler.
TOLERANCE_LAST10 = 0.2


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()] if path.is_file() else []


def summary(logs: Path) -> dict:
    path = logs / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {"missing": str(path)}


def loss_curves(root: Path) -> tuple[dict[int, float], dict[int, float]]:
    nemo = {r["step"] + 1: r["value"] for r in jsonl(root / "logs_nemo" / "nemo2_tb_scalars.jsonl")
            if r["tag"] == "reduced_train_loss"}
    bridge = {r["iteration"]: r["loss"] for r in jsonl(root / "logs_kaiyuan" / "kaiyuan_metrics.jsonl")
              if r.get("event") == "step" and r.get("loss") is not None}
    return nemo, bridge


def report(root: Path, rev: str, commands: list[str]) -> dict:
    nemo, bridge = loss_curves(root)
    common = sorted(set(nemo) & set(bridge))
    diffs = [abs(nemo[i] - bridge[i]) for i in common]
    last10 = common[-10:]
    gap = statistics.mean(nemo[i] - bridge[i] for i in last10) if last10 else None
    nemo_part, resume, qwen = (summary(root / f"logs_{p}") for p in ("nemo", "resume", "qwen"))
    export_logs = root / "logs_export"
    exported = summary(export_logs)
    hf_loss = next((line.split()[1] for line in (export_logs / "hf_loss.log").read_text().splitlines()
                    if line.startswith("hf_loss")), None) if (export_logs / "hf_loss.log").is_file() else None
    served = {}
    for name in ("serve_api", "serve_completion"):
        path = export_logs / f"{name}.json"
        served[name] = json.loads(path.read_text()) if path.is_file() and path.stat().st_size else None
    resume_ok = any(s["step"] == "nemo_resume" and s["rc"] == 0 for s in resume.get("steps", []))
    resume_log = root / "logs_resume" / "nemo_resume.log"
    resume_error = next((line.strip()[:400] for line in resume_log.read_text(errors="replace").splitlines()
                         if line.startswith("KeyError")), None) if resume_log.is_file() else None
    # The first --part nemo of the day, before the plain optimizer (compat.nemo2_distributed_optimizer_saves), if kept.
    first_log = root / "logs_nemo_first" / "nemo_train.log"
    first_save_error = next((line.strip() for line in first_log.read_text(errors="replace").splitlines()
                             if line.startswith("Unexpected error")), None) if first_log.is_file() else None
    probe_path = root / "nemo2_optimizer_probe.json"  # tests/gpu/nemo2_optimizer_probe.py, where it ran
    probe = json.loads(probe_path.read_text()) if probe_path.is_file() else None
    checks = {
        "nemo_trained_100_steps": max(nemo, default=0) == 100 and nemo[100] < nemo[1] - 5,
        "keep_k_3_kept": nemo_part.get("kept_not_last") == 3,
        "tensorboard_written": bool(nemo),
        "restart_resumed": resume_ok,
        "loss_curves_within_tolerance": gap is not None and abs(gap) <= TOLERANCE_LAST10,
        "nemo2_checkpoint_exported_and_served": bool(served["serve_api"] and served["serve_completion"]),
        **({"optimizer_probe_agrees_with_compat": probe["ok"]} if probe else {}),
        "qwen3_both_sides_timed": bool((qwen.get("nemo2") or {}).get("tokens_per_s")
                                       and (qwen.get("kaiyuan") or {}).get("tokens_per_s")),
    }
    return {
        "what": "issue #33 on the H200: nemo llm pretrain --factory kaiyuan_gpt_smoke (100 steps, keep-K, TensorBoard, "
                "restart), kaiyuan train gpt_smoke on the same data/seed/batch/schedule (local spec, no fusions, both "
                "sides), the NeMo 2 checkpoint -> HF -> kaiyuan serve, and --factory kaiyuan_qwen3 beside kaiyuan "
                "train qwen3_1p7b (tokens/s)",
        "command": commands, "revision": rev, "host": socket.gethostname() + " (report); GPU: NVIDIA H200",
        "date": date.today().isoformat(), "all_ok": all(checks.values()), "checks": checks,
        "loss_comparison": {"steps": len(common), "tolerance_last10_mean_abs_nats": TOLERANCE_LAST10,
                            "last10_mean_nemo_minus_kaiyuan": gap,
                            "mean_abs_diff": statistics.mean(diffs) if diffs else None,
                            "max_abs_diff": max(diffs, default=None),
                            "nemo_first_last": [nemo.get(1), nemo.get(100)],
                            "kaiyuan_first_last": [bridge.get(1), bridge.get(100)]},
        "first_save_error": first_save_error, "optimizer_probe": probe,
        "nemo_checkpoints": nemo_part.get("checkpoints"), "resume": {"ok": resume_ok, "error": resume_error,
                                                                     "resume_lines": resume.get("resume_lines")},
        "export": {"hf_loss_en_jargon_8x1024": float(hf_loss) if hf_loss else None,
                   "nemo_last_train_loss": nemo.get(100), "served": served,
                   "steps": exported.get("steps", [])},
        "qwen3_1p7b": {k: v for k, v in qwen.items() if k not in ("part",)},
        "curves": {"nemo": [[i, nemo[i]] for i in sorted(nemo)], "kaiyuan": [[i, bridge[i]] for i in sorted(bridge)]},
    }


def plot(data: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, diff_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    curves = data["curves"]
    loss_ax.plot(*zip(*curves["nemo"]), label="nemo llm pretrain --factory kaiyuan_gpt_smoke", linewidth=1.2)
    loss_ax.plot(*zip(*curves["kaiyuan"]), label="kaiyuan train gpt_smoke", linewidth=1.2)
    loss_ax.set(title="gpt_smoke on the sample corpus, local spec, no fusions (H200)", xlabel="step",
                ylabel="training loss", yscale="log")
    loss_ax.legend()
    kaiyuan = dict(map(tuple, curves["kaiyuan"]))
    diff = [(i, v - kaiyuan[i]) for i, v in curves["nemo"] if i in kaiyuan]
    diff_ax.plot(*zip(*diff), color="tab:red", linewidth=1)
    diff_ax.axhline(0, color="grey", linewidth=0.8)
    for bound in (TOLERANCE_LAST10, -TOLERANCE_LAST10):
        diff_ax.axhline(bound, color="grey", linestyle=":", linewidth=0.8)
    q = data["qwen3_1p7b"]
    note = ""
    if (q.get("nemo2") or {}).get("tokens_per_s") and (q.get("kaiyuan") or {}).get("tokens_per_s"):
        note = (f"\nqwen3_1p7b tokens/s: NeMo 2 {q['nemo2']['tokens_per_s']:,.0f}, "
                f"kaiyuan {q['kaiyuan']['tokens_per_s']:,.0f}"
                f" ({q['kaiyuan_over_nemo2']:.3f}x)")
    diff_ax.set(title=f"NeMo minus kaiyuan (dotted: the stated tolerance on the last 10){note}", xlabel="step",
                ylabel="loss difference (nats)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--rev", required=True)
    ap.add_argument("--commands", type=Path, required=True, help="the parts' commands, one a line")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    data = report(args.root, args.rev, [c for c in args.commands.read_text().splitlines() if c.strip()])
    args.out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    plot(data, args.out.with_suffix(".png"))
    print(json.dumps({k: data[k] for k in ("all_ok", "checks", "loss_comparison")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
