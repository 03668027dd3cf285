"""The removal report a cleaning run leaves beside its manifest: per step, the documents and characters it removed
(with its reasons) and a few of the removed documents, as a Markdown table (clean_report.md) and a bar chart
(clean_report.png). Written from the manifest and the removed-document samples only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPORT_MD = "clean_report.md"
REPORT_PNG = "clean_report.png"
EXAMPLES = 3
EXAMPLE_CHARS = 160


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def _examples(out: Path, sample: str | None) -> list[str]:
    if not sample:
        return []
    lines = (out / sample).read_text(encoding="utf-8").splitlines()[:EXAMPLES]
    found = []
    for line in lines:
        doc = json.loads(line)
        text = " ".join(doc.get("text", "").split())
        head = text[:EXAMPLE_CHARS] + ("…" if len(text) > EXAMPLE_CHARS else "")
        kept = doc.get("metadata", {}).get("kept_copy")
        found.append(f"`{doc.get('id')}`" + (f" (duplicate of `{kept}`)" if kept else "") + f": {head}")
    return found


def write_report(manifest: dict[str, Any], out: Path) -> dict[str, str]:
    out = Path(out)
    steps = manifest["steps"]
    chars_in = steps[0]["characters_in"] if steps else 0
    rows = ["| step | documents in | removed | removed share | characters removed | reasons |",
            "|---|---:|---:|---:|---:|---|"]
    for s in steps:
        removed_chars = s["characters_in"] - s["characters_out"]
        reasons = ", ".join(f"{k} {v:,}" for k, v in s["removed_by_reason"].items())
        rewritten = s.get("rewritten")
        if rewritten and rewritten["documents"]:
            reasons += (", " if reasons else "") + (f"lines removed from {rewritten['documents']:,} kept documents "
                                                    f"({rewritten['characters_removed']:,} characters)")
        rows.append(f"| {s['step']} | {s['documents_in']:,} | {s['removed']:,} | "
                    f"{_share(s['removed'], s['documents_in'])} | {removed_chars:,} "
                    f"({_share(removed_chars, chars_in)} of the input) | {reasons} |")
    skipped = manifest.get("bad_rows_skipped") or {}
    text = [f"# Cleaning report: {manifest['documents_in']:,} documents in, {manifest['documents_out']:,} out",
            "", f"Config `{manifest['config_source']}` (sha256 {manifest['config_hash'][:12]}), input "
            f"`{manifest['input_dir']}`.", ""]
    if skipped:
        text += [f"Bad rows skipped: {', '.join(f'{k} {v:,}' for k, v in skipped.items())}.", ""]
    text += rows + ["", "## Removed documents", ""]
    samples = manifest.get("removed_samples") or {}
    for s in steps:
        examples = _examples(out, samples.get(s["step"]))
        if examples:
            text += [f"**{s['step']}** (a random sample: `{samples[s['step']]}`)", ""]
            text += [f"- {e}" for e in examples] + [""]
    if not samples:
        text += ["No samples kept: `--sample-removed N` keeps N removed documents per step.", ""]
    (out / REPORT_MD).write_text("\n".join(text), encoding="utf-8")
    _plot(steps, out / REPORT_PNG)
    return {"table": REPORT_MD, "plot": REPORT_PNG}


def _plot(steps: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s["step"] for s in steps][::-1]
    docs = [s["removed"] for s in steps][::-1]
    chars = [s["characters_in"] - s["characters_out"] for s in steps][::-1]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.5 * len(names) + 1.5), sharey=True)
    for ax, values, title in ((axes[0], docs, "documents removed"), (axes[1], chars, "characters removed")):
        ax.barh(names, values, color="#4477aa")
        ax.set_title(title)
        ax.ticklabel_format(axis="x", style="plain")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
