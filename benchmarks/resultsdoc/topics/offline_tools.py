"""The offline tools' benchmarks: `kaiyuan ckpt`'s peak memory and the data conversion's throughput."""

from __future__ import annotations

from resultsdoc.entries import Data
from resultsdoc.formatting import mem, n0, ratio


def convert(d: Data) -> str:
    r = d["results"]
    return (f"{d['setup'][0].upper()}{d['setup'][1:]}; identical output tokens: "
            f"{' and '.join(ratio(x['speedup_vs_megatron']) + f' ({x['input_mb']:.0f} MB of text)' for x in r)} "
            f"Megatron-LM's `tools/preprocess_data.py` (rev {d['megatron_lm_revision']}) tokens/s per core; peak RSS "
            f"{n0(r[0]['ours']['peak_rss_mb'])} → {n0(r[-1]['ours']['peak_rss_mb'])} MiB for "
            f"{r[-1]['input_mb'] / r[0]['input_mb']:.0f}× the input (Megatron-LM "
            f"{n0(r[-1]['megatron_lm']['peak_rss_mb'])} MiB).")


def ckpt_memory_caption(d: Data) -> str:
    c = d["largest_chunk"]
    return (f"`kaiyuan ckpt` on a {d['recipe']}-shaped torch_dist checkpoint saved on the CPU host, weights only (no "
            f"optimizer state): {n0(d['checkpoint']['disk_mib'])} MiB on disk, {c['chunks']} stored chunks, the "
            f"largest `{c['fqn']}` ({mem(c['mib'], 'MiB')}, {'the whole tensor' if c['whole_tensor'] else 'a part'})."
            f" `ckpt verify` {'accepts' if d['verify_accepts'] else 'REJECTS'} it. Peak resident memory of a fresh "
            "process each; the floor imports the CLI, the ckpt modules and DCP and reads nothing.")


def ckpt_memory_rows(d: Data) -> list[list[str]]:
    rows = []
    for r in d["rows"]:
        above = [f"{n0(r['above_floor_mib'])} MiB", ratio(r["above_floor_over_disk"]),
                 ratio(r["above_floor_over_largest_chunk"], 1)] if r["above_floor_mib"] else ["", "", ""]
        rows.append([r["what"] + ("" if r["ok"] else f" (exit {r['rc']}: FAILED)"), f"{n0(r['peak_rss_mib'])} MiB",
                     *above, f"{r['wall_s']:.0f} s"])
    return rows


def ckpt_memory_after(d: Data) -> str:
    r = {row["what"]: row for row in d["rows"]}
    verify, diff = r["ckpt verify"], r["ckpt diff A B"]
    whole = next(row for what, row in r.items() if what.startswith("whole load: dcp"))
    return ("Ratios are of the memory above the floor. The lazy reads are bounded by the largest stored chunk, not "
            f"flat: `verify` holds {ratio(verify['above_floor_over_largest_chunk'], 1)} that chunk and `diff` "
            f"{ratio(diff['above_floor_over_largest_chunk'], 1)} (A's and B's chunk, each read whole; "
            "the float32 sums go a slice at a time), so with a largest chunk of "
            f"{mem(d['largest_chunk']['mib'], 'MiB')} `diff` "
            f"{'needs more than' if diff['peak_rss_bytes'] > whole['peak_rss_bytes'] else 'stays below'} a whole "
            "DCP load of the checkpoint. Wall times are from a host shared with a test suite.")
