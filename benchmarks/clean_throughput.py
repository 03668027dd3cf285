"""Cleaning throughput: `kaiyuan data clean` (the default `web` config: exact dedup, length, Gopher, C4, FineWeb,
MinHash, token counts) on a generated corpus, beside a plain single-process Python loop that reads the same parquet
and does exact dedup (a set of sha1 digests) and the same heuristics (the same datatrove filter objects, called one
document at a time). Reports documents/s and MB/s per core, and the peak RSS of each process tree (MinHash state is
the memory risk). A benchmark, not a test; the machine's load average is recorded beside the numbers.

usage: python benchmarks/clean_throughput.py --size-mb 512 --out benchmarks/results/DATE_clean_throughput.json"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert_throughput import run_measured  # noqa: E402  (process-tree peak RSS sampling)
from provenance import provenance, this_command, write_json  # noqa: E402

from kaiyuan_recipes.data.clean.synthetic import ProseGenerator, low_quality  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "recipes" / "cleaning" / "web.yaml"


def make_corpus(out: Path, size_mb: int, file_mb: int = 64, seed: int = 0) -> dict:
    """~size_mb of prose in files of ~file_mb: 5 % exact copies, 5 % near copies (a few words replaced), 3 %
    low-quality documents, the rest unique."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    gen, rng = ProseGenerator(seed), random.Random(seed + 1)
    out.mkdir(parents=True)
    total = docs = 0
    index = 0
    recent: list[str] = []
    while total < size_mb * 1_000_000:
        texts, size = [], 0
        while size < file_mb * 1_000_000 and total + size < size_mb * 1_000_000:
            roll = rng.random()
            if roll < 0.05 and recent:
                text = rng.choice(recent)
            elif roll < 0.10 and recent:
                words = rng.choice(recent).split(" ")
                for _ in range(3):
                    words[rng.randrange(len(words))] = gen.word()
                text = " ".join(words)
            elif roll < 0.13:
                text = low_quality(gen, rng.choice(("length", "gopher_repetition", "gopher_quality", "c4",
                                                    "fineweb")))
            else:
                text = gen.document()
                recent = (recent + [text])[-200:]
            texts.append(text)
            size += len(text.encode("utf-8"))
        pq.write_table(pa.table({"id": [f"{index}-{i}" for i in range(len(texts))], "text": texts}),
                       out / f"part-{index:05d}.parquet", row_group_size=2048, compression="zstd")
        total, docs, index = total + size, docs + len(texts), index + 1
    return {"documents": docs, "text_bytes": total, "files": index}


def baseline_loop(input_dir: Path) -> dict:
    """Single process, no framework: read, exact dedup, the heuristics in the config's order."""
    import pyarrow.parquet as pq
    from datatrove.data import Document

    from kaiyuan_recipes.data.clean.config import HEURISTICS, heuristic_class, load_config
    from kaiyuan_recipes.data.clean.steps import LengthCharFilter

    cfg = load_config(CONFIG)
    lc = cfg.length
    filters = [LengthCharFilter(lc.min_chars, lc.max_chars, lc.max_non_printable_ratio,
                                lc.max_replacement_char_ratio, lc.min_cjk_ratio)]
    for name in HEURISTICS:
        h = cfg.heuristics.get(name)
        if h and h.enabled:
            params = {k: tuple(v) if isinstance(v, list) else v for k, v in h.params.items()}
            filters.append(heuristic_class(name)(**params, language=cfg.language))
    seen: set[bytes] = set()
    kept = read = 0
    for path in sorted(input_dir.glob("*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=2048, columns=["text"]):
            for text in batch.column(0).to_pylist():
                read += 1
                digest = hashlib.sha1(text.encode("utf-8")).digest()
                if digest in seen:
                    continue
                seen.add(digest)
                doc = Document(text, str(read))
                if all(f.filter(doc) is True for f in filters):
                    kept += 1
    return {"documents_in": read, "documents_out": kept}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--baseline", type=Path, help=argparse.SUPPRESS)  # internal: the plain loop, in its own process
    args = ap.parse_args()
    if args.baseline:
        args.out.write_text(json.dumps(baseline_loop(args.baseline)))
        return
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="clean-bench-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        corpus = make_corpus(work / "raw", args.size_mb)
        corpus["generate_seconds"] = time.perf_counter() - started
        print(json.dumps(corpus), flush=True)
        ours = run_measured([sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "clean", "--input-dir",
                             str(work / "raw"), "--output-dir", str(work / "clean"), "--config", str(CONFIG),
                             "--workers", str(args.cores)], work)
        manifest = json.loads((work / "clean" / "clean_manifest.json").read_text())
        ours |= {"documents_out": manifest["documents_out"], "cores": args.cores,
                 "steps": {s["step"]: s["removed"] for s in manifest["steps"]}}
        results = {"ours": ours}
        if not args.skip_baseline:
            base_out = work / "baseline.json"
            base = run_measured([sys.executable, __file__, "--baseline", str(work / "raw"), "--out", str(base_out)],
                                work)
            base |= json.loads(base_out.read_text()) | {"cores": 1}
            results["plain_loop"] = base
        for r in results.values():
            r["documents_per_s_per_core"] = corpus["documents"] / r["seconds"] / r["cores"]
            r["mb_per_s_per_core"] = corpus["text_bytes"] / 1e6 / r["seconds"] / r["cores"]
    report = provenance(this_command()) | {
        "cpu": subprocess.run(["bash", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                              capture_output=True, text=True).stdout.strip(),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "setup": f"generated prose corpus, {args.cores} core(s) for ours (datatrove local executor), one process "
                 "for the plain loop (exact dedup + the same heuristics, no MinHash, no token counts)",
        "corpus": corpus, "results": results,
    }
    write_json(args.out, report)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
