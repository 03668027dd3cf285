"""The report of tests/gpu/curriculum_proof.sh, from the run's own artifacts: the ordered indices phase 2 trained
with (the files OrderedGPTDataset and megatron-core's BlendedDataset cached in the run's dataset_cache), the
run's metrics (steps with their consumed samples, starts, checkpoints), its console logs, `kaiyuan stop`'s
result, and the average + export at the end. Every check is computed here; `all_ok` is their conjunction."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import provenance, write_json  # noqa: E402

from kaiyuan_recipes.config.run_layout import read_metrics  # noqa: E402

GBS = 8
PHASES = {1: (1, 20), 2: (21, 50), 3: (51, 65)}
ORDERED_LINE = re.compile(r"kaiyuan: ordered dataset (\S+) \(train, order (\w+)\): (built|loaded)")


def cached(cache: Path, cls: str) -> list[tuple[dict, Path]]:
    """(description, path prefix) of each train-split index set of `cls` in the run's dataset cache."""
    found = []
    for desc in sorted(cache.glob(f"*-{cls}-train-description.txt")):
        found.append((json.loads(desc.read_text()), Path(str(desc)[:-len("description.txt")])))
    return found


def phase2_stream(work: Path) -> dict:
    """Phase 2's consumed samples as the run's own cached indices lay them out: for each sample, its source and
    the ranks of the documents it packs."""
    cache = work / "runs" / "cur" / "dataset_cache"
    ordered = {d["dataset_path"]: p for d, p in cached(cache, "OrderedGPTDataset")}
    blended = [(d, p) for d, p in cached(cache, "BlendedDataset")
               if all(x.get("class") == "OrderedGPTDataset" for x in d["datasets"])]
    if len(blended) != 1 or len(ordered) != 2:
        raise SystemExit(f"expected one blended set over two ordered sources in {cache}, found {len(blended)} / "
                         f"{sorted(ordered)}")
    description, prefix = blended[0]
    sources = [x["dataset_path"] for x in description["datasets"]]
    dataset_index = np.load(f"{prefix}dataset_index.npy")
    sample_in_dataset = np.load(f"{prefix}dataset_sample_index.npy")
    indices = {path: {k: np.load(f"{ordered[path]}{k}_index.npy") for k in ("document", "sample")} for path in sources}
    ranks = {path: np.concatenate([np.load(p) for p in sorted(Path(path).glob("*.rank.npy"))]) for path in sources}
    samples = (PHASES[2][1] - PHASES[2][0] + 1) * GBS
    per_source: dict[str, list[tuple[int, float]]] = {p: [] for p in sources}  # (document position, rank)
    which = []
    for j in range(samples):
        path = sources[int(dataset_index[j])]
        s = int(sample_in_dataset[j])
        doc_index, sample_index = indices[path]["document"], indices[path]["sample"]
        for pos in range(int(sample_index[s][0]), int(sample_index[s + 1][0]) + 1):
            per_source[path].append((pos, float(ranks[path][doc_index[pos]])))
        which.append(path)
    checks = {}
    for path, seen in per_source.items():
        n = len(np.unique(indices[path]["document"]))  # the train split's documents (one epoch of the index)
        monotone = all(b[1] >= a[1] for a, b in zip(seen, seen[1:]) if a[0] // n == b[0] // n)  # within an epoch
        stored = [float(r) for r in ranks[path][:50]]
        checks[Path(path).name] = {
            "documents": len(ranks[path]), "train_documents": n, "samples": which.count(path),
            "epochs_touched": seen[-1][0] // n + 1,
            "ranks_ascending_within_each_epoch": monotone,
            "stored_order_is_not_rank_order": stored != sorted(stored),
            "first_ranks": [r for _, r in seen[:8]],
        }
    share = float(np.asarray(description["weights"])[0])
    running = np.cumsum([w == sources[0] for w in which])
    deviation = float(np.max(np.abs(running - share * np.arange(1, samples + 1))))
    return {"samples": samples, "sources": checks, "first_source_weight": share,
            "interleave_max_deviation_samples": deviation, "interleaved_in_proportion": deviation <= 2.0}


def resume_checks(work: Path, logs: Path) -> dict:
    records = read_metrics(work / "runs" / "cur" / "run_state")
    starts = [r["iteration"] for r in records if r["event"] == "train_start"]
    steps = {r["iteration"]: r for r in records if r["event"] == "step"}
    stop_file = logs / "stop.json"  # what `kaiyuan stop` printed, where the script kept it
    stop = json.loads(stop_file.read_text()) if stop_file.is_file() else {}
    phase2_starts = [s for s in starts if PHASES[2][0] - 1 <= s < PHASES[2][1]]
    resumed_at = phase2_starts[1] if len(phase2_starts) > 1 else None
    saved = [r["iteration"] for r in records if r["event"] == "checkpoint"]
    stop["checkpoint_at_resume_point"] = resumed_at in saved  # the save the SIGTERM made, from the run's metrics
    # Every launch's console log, as the run directory keeps them (one file per launch).
    launch_logs = sorted((work / "runs" / "cur" / "logs").glob("train-*.log"))
    lines = [ORDERED_LINE.search(line) for path in launch_logs
             for line in path.read_text(errors="replace").splitlines()]
    events = [(m.group(2), m.group(3)) for m in lines if m]
    # The metrics callback records a step's consumed samples as the step starts: (iteration - 1) x batch, across
    # every launch, the resume included, if no sample was skipped or repeated.
    consumed_ok = all(steps[i]["consumed_samples"] == (i - 1) * GBS for i in steps)
    return {
        "train_starts": starts, "resumed_at": resumed_at,
        "stopped_inside_phase_2": resumed_at is not None and PHASES[2][0] < resumed_at < PHASES[2][1],
        "stop": {k: stop.get(k) for k in ("checkpoint_saved", "sigkill_after_grace", "last_checkpoint",
                                          "checkpoint_at_resume_point")},
        "first_step_after_resume": min((i for i in steps if resumed_at and i > resumed_at), default=None),
        "consumed_samples_continuous": consumed_ok and all(i in steps for i in range(1, PHASES[3][1] + 1)),
        "ordered_index_events": events,
        "resumed_run_loaded_the_same_indices": ("by_rank", "built") in events and ("by_rank", "loaded") in events,
    }


def average_checks(work: Path, logs: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report = json.loads((logs / "average.json").read_text())
    listing = json.loads((logs / "ckpt_ls.json").read_text())
    hf = work / "avg_hf"
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(hf)
    ids = tok("The curriculum orders documents by", return_tensors="pt").input_ids
    with torch.no_grad():
        loss = float(model(ids, labels=ids).loss)
    return {"kept": [c["iteration"] for c in listing["checkpoints"]],
            "averaged": [Path(s).name for s in report["sources"]], "weights": report["weights"],
            "optimizer_state": report["optimizer_state"], "exported_hf_loss_on_a_prompt": loss,
            "export_finite": bool(np.isfinite(loss))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--logs", type=Path, required=True)
    ap.add_argument("--rev", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", required=True)
    args = ap.parse_args()
    order, resume, average = phase2_stream(args.work), resume_checks(args.work, args.logs), \
        average_checks(args.work, args.logs)
    ok = (all(s["ranks_ascending_within_each_epoch"] and s["stored_order_is_not_rank_order"]
              for s in order["sources"].values())
          and order["interleaved_in_proportion"] and resume["stopped_inside_phase_2"]
          and resume["first_step_after_resume"] == (resume["resumed_at"] or -1) + 1
          and resume["consumed_samples_continuous"] and resume["resumed_run_loaded_the_same_indices"]
          and resume["stop"]["checkpoint_at_resume_point"] and len(average["averaged"]) == 3
          and average["export_finite"])
    result = provenance(args.command) | {"revision": args.rev, "name": "curriculum_ordered_phase_gpu",
                                         "phase_iterations": PHASES, "global_batch_size": GBS,
                                         "phase2_order": order, "stop_resume": resume, "average_export": average,
                                         "all_ok": bool(ok)}
    write_json(args.out, result)
    print(json.dumps({"all_ok": ok, "resume": resume["resumed_at"], "order": order["sources"]}, indent=1))


if __name__ == "__main__":
    main()
