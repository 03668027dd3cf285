"""Peak memory of `kaiyuan ckpt verify | diff | inspect` on a full-size checkpoint, against loading it whole.

A qwen3_1p7b-shaped model (ModelShape.for_recipe, bf16, local spec; export's build_cpu_model) is saved twice on
this CPU host with Megatron-Bridge's save_megatron_model (megatron-core's dist_checkpointing.save, torch_dist,
gloo, world size 1): A, and B with every decoder weight perturbed. Weights only: no optimizer state (a 2B model's
fp32 main copy and Adam moments would be 24 GB, more than this host's RAM). Then each command runs in a fresh
process whose peak resident set (ru_maxrss from wait4, i.e. VmHWM) is recorded, next to:

- the floor: a process that imports the CLI and the ckpt modules (torch, DCP) and reads nothing;
- the whole-checkpoint loads: torch.distributed.checkpoint's load into full tensors of every entry, and
  megatron-core's dist_checkpointing.load of the model's full sharded state dict (the model built first, as
  training and export hold it).

Each figure is also given above the floor, as a ratio to the checkpoint's size on disk and to its largest stored
chunk: the lazy reads are bounded by the largest chunk (one whole tensor here, the 594 MiB embedding), not flat.

usage: python benchmarks/ckpt_memory.py [--recipe qwen3_1p7b] [--work /tmp/ckpt_memory] [--out FILE] [--keep]"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance, this_command, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / f"{time.strftime('%Y-%m-%d')}_ckpt_memory.json"
MIB = 2**20
FLOOR = "import kaiyuan_recipes.cli.main, kaiyuan_recipes.ckpt.verify, kaiyuan_recipes.ckpt.diff, " \
        "kaiyuan_recipes.ckpt.inspect, torch.distributed.checkpoint"


# ---------------------------------------------------------------------------------------------------- the writer

def write_checkpoints(recipe: str, work: Path) -> dict[str, Any]:
    """A and B (decoder weights scaled by 1.01) under work/; run in its own process, so its memory goes with it."""
    import torch

    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir, tokenizer_vocab_size
    from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model
    from kaiyuan_recipes.export.megatron_to_hf import bridge_for, ensure_single_process_group
    from kaiyuan_recipes.models.shape import ModelShape

    ensure_single_process_group()  # gloo, one rank, in-process store (as the export's own)
    shape = ModelShape.for_recipe(recipe)
    torch.manual_seed(0)
    model = build_cpu_model(shape, torch.bfloat16)
    bridge = bridge_for(shape, tokenizer_vocab_size(default_tokenizer_dir()))
    start = time.perf_counter()
    bridge.save_megatron_model([model], work / "a")
    write_s = time.perf_counter() - start
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("decoder.layers."):
                p.mul_(1.01)
    bridge.save_megatron_model([model], work / "b")
    return {"parameters": sum(p.numel() for p in model.parameters()), "write_s": write_s}


# ---------------------------------------------------------------------------------------------------- the whole loads

def dcp_whole_load(ckpt: str) -> None:
    """Every tensor allocated whole and every object read, by one dcp.load with DCP's default planner."""
    import io

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(ckpt).read_metadata()
    state = {k: torch.empty(v.size, dtype=v.properties.dtype) if isinstance(v, TensorStorageMetadata)
             else io.BytesIO() for k, v in metadata.state_dict_metadata.items()}
    dcp.load(state, storage_reader=FileSystemReader(ckpt), no_dist=True)
    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
    print(json.dumps({"tensors": len(tensors), "bytes": sum(t.numel() * t.element_size() for t in tensors)}))


def mcore_whole_load(recipe: str, ckpt: str) -> None:
    """megatron-core's dist_checkpointing.load of the model's sharded_state_dict, the model built first."""
    import torch
    from megatron.core import dist_checkpointing

    from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model
    from kaiyuan_recipes.export.megatron_to_hf import ensure_single_process_group
    from kaiyuan_recipes.models.shape import ModelShape

    ensure_single_process_group()
    model = build_cpu_model(ModelShape.for_recipe(recipe), torch.bfloat16)
    loaded = dist_checkpointing.load(model.sharded_state_dict(), ckpt)
    model.load_state_dict(loaded, strict=False)
    print(json.dumps({"keys": len(loaded)}))


# ---------------------------------------------------------------------------------------------------- measuring

def peak_rss(argv: list[str], log: Path) -> dict[str, Any]:
    """Run argv in a fresh process; its peak resident set from wait4 (the kernel's VmHWM, KiB on Linux)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"argv": argv, "rc": proc.returncode, "wall_s": round(time.perf_counter() - start, 1),
            "peak_rss_bytes": usage.ru_maxrss * 1024, "log_tail": log.read_text()[-400:]}


def largest_chunk(ckpt: Path) -> dict[str, Any]:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(ckpt)).read_metadata()
    best: dict[str, Any] = {"bytes": 0}
    tensors = chunks = 0
    for fqn, md in metadata.state_dict_metadata.items():
        if not isinstance(md, TensorStorageMetadata):
            continue
        tensors += 1
        for c in md.chunks:
            chunks += 1
            n = md.properties.dtype.itemsize
            for s in c.sizes:
                n *= s
            if n > best["bytes"]:
                best = {"bytes": n, "fqn": fqn, "sizes": list(c.sizes), "dtype": str(md.properties.dtype),
                        "whole_tensor": list(c.sizes) == list(md.size)}
    stored = max(info.length for info in metadata.storage_data.values())
    return {**best, "largest_stored_item_bytes": stored, "tensors": tensors, "chunks": chunks,
            "entries": len(metadata.state_dict_metadata)}


def host_ram() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="qwen3_1p7b")
    ap.add_argument("--work", type=Path, default=Path("/tmp/ckpt_memory"))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints under --work")
    ap.add_argument("--reuse", action="store_true", help="measure checkpoints already under --work (no new save)")
    ap.add_argument("--_child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        what, *rest = args._child
        if what == "write":
            write_json(Path(rest[1]) / "written.json", write_checkpoints(rest[0], Path(rest[1])))
        elif what == "dcp":
            dcp_whole_load(rest[0])
        else:
            mcore_whole_load(rest[0], rest[1])
        return

    from kaiyuan_recipes.ckpt import store

    work = args.work.resolve()
    if ROOT in work.parents or work == ROOT:
        raise SystemExit(f"{work}: inside the repository; the checkpoints are ~8 GB, put them elsewhere")
    me = [sys.executable, str(Path(__file__).resolve())]
    written: dict[str, Any] = {}
    if not args.reuse:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        w = peak_rss([*me, "--_child", "write", args.recipe, str(work)], work / "write.log")
        if w["rc"]:
            raise SystemExit(f"writing the checkpoints failed:\n{w['log_tail']}")
        written = json.loads((work / "written.json").read_text()) | {"writer_peak_rss_bytes": w["peak_rss_bytes"],
                                                                     "writer_wall_s": w["wall_s"]}
    a, b = store.resolve_checkpoint(work / "a"), store.resolve_checkpoint(work / "b")
    disk = store.disk_bytes(a)
    chunk = largest_chunk(a)
    cli = [sys.executable, "-m", "kaiyuan_recipes.cli.main", "ckpt"]
    runs = {
        "floor (imports only)": [sys.executable, "-c", FLOOR],
        "ckpt verify": [*cli, "verify", str(work / "a")],
        "ckpt diff A B": [*cli, "diff", str(work / "a"), str(work / "b")],
        "ckpt inspect --json": [*cli, "inspect", str(work / "a"), "--json"],
        "whole load: dcp.load into full tensors": [*me, "--_child", "dcp", str(a)],
        "whole load: megatron-core dist_checkpointing.load (model built)": [*me, "--_child", "mcore", args.recipe,
                                                                             str(a)],
    }
    expected_rc = {"ckpt diff A B": 1}  # diff exits 1 when the checkpoints differ, which B does by construction
    measured = {}
    for i, (label, argv) in enumerate(runs.items()):
        m = peak_rss(argv, work / f"run{i}.log")
        m["ok"] = m["rc"] == expected_rc.get(label, 0)
        measured[label] = m
        print(f"{label}: rc {m['rc']}, {m['peak_rss_bytes'] / MIB:,.0f} MiB, {m['wall_s']} s", flush=True)
    floor = measured["floor (imports only)"]["peak_rss_bytes"]
    rows = []
    for label, m in measured.items():
        peak = m["peak_rss_bytes"]
        rows.append({"what": label, "rc": m["rc"], "ok": m["ok"], "wall_s": m["wall_s"], "peak_rss_bytes": peak,
                     "peak_rss_mib": round(peak / MIB, 1), "above_floor_mib": round((peak - floor) / MIB, 1),
                     "peak_over_disk": round(peak / disk, 3), "above_floor_over_disk": round((peak - floor) / disk, 3),
                     "above_floor_over_largest_chunk": round((peak - floor) / chunk["bytes"], 2)})
    verify_tail = measured["ckpt verify"]["log_tail"].strip().splitlines()
    result = {
        **provenance(this_command("benchmarks/ckpt_memory.py")),
        "host_detail": {"cpu": cpu_model(), "ram_bytes": host_ram(),
                        "note": "2 cores shared with a full test suite running at the same time: wall times are "
                                "indicative only; memory is per process"},
        "recipe": args.recipe,
        "checkpoint": {"path": str(a), "format": store.checkpoint_format(a), "disk_bytes": disk,
                       "disk_mib": round(disk / MIB, 1), "weights_only": True, "optimizer_state": False,
                       "writer": "build_cpu_model (bf16, local spec) + Megatron-Bridge save_megatron_model "
                                 "(megatron-core dist_checkpointing.save, torch_dist), gloo, world size 1",
                       "b": "a second save with every decoder.layers.* weight scaled by 1.01",
                       "b_disk_bytes": store.disk_bytes(b), **written},
        "largest_chunk": chunk | {"mib": round(chunk["bytes"] / MIB, 1)},
        "verify_accepts": measured["ckpt verify"]["rc"] == 0,
        "verify_says": verify_tail[-1] if verify_tail else "",
        "floor_bytes": floor,
        "rows": rows,
        "all_ok": all(r["ok"] for r in rows),
        "measure": "peak resident set (ru_maxrss of the process, from os.wait4) of a fresh process each; floor = a "
                   "process that imports the CLI, the ckpt modules and DCP",
    }
    write_json(args.out, result)
    print(json.dumps({k: result[k] for k in ("checkpoint", "largest_chunk", "verify_accepts")}, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
