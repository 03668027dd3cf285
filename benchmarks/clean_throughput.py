"""Cleaning throughput: `kaiyuan data clean` (the default `web` config: exact dedup, length, Gopher, C4, FineWeb,
MinHash, token counts) on a generated corpus, beside a plain single-process Python loop that reads the same parquet
and does exact dedup (a set of sha1 digests) and the same heuristics (the same datatrove filter objects, called one
document at a time, with datatrove's default word tokenizer). Reports documents/s and MB/s per core (by wall time and
by the CPU seconds of the process tree), the peak RSS of each process tree, and the peak size on disk of the MinHash
and exact-dedup state. A benchmark, not a test; the machine's load average is recorded beside the numbers.
`--baseline-files N` runs the plain loop on the first N files only (its rate per document does not depend on the
corpus size; the whole corpus at its speed takes hours).

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
from process_tree import run_measured  # noqa: E402
from provenance import provenance, this_command, write_json  # noqa: E402

from kaiyuan_recipes.data.clean.synthetic import ProseGenerator, low_quality  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "recipes" / "cleaning" / "web.yaml"


def make_corpus(out: Path, size_mb: int, file_mb: int = 64, seed: int = 0, row_group: int = 2048) -> dict:
    """~size_mb of prose in files of ~file_mb: 5 % exact copies, 5 % near copies (a few words replaced), 3 %
    low-quality documents, the rest unique. Document lengths are log-normal like web text's: a median of 9 paragraphs
    (about 2 KB), a long tail (mean about 3.5 KB), capped at 400 paragraphs."""
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
                paragraphs = min(400, max(1, round(rng.lognormvariate(2.2, 0.9))))
                text = gen.document((paragraphs, paragraphs))
                recent = (recent + [text])[-200:]
            texts.append(text)
            size += len(text.encode("utf-8"))
        pq.write_table(pa.table({"id": [f"{index}-{i}" for i in range(len(texts))], "text": texts}),
                       out / f"part-{index:05d}.parquet", row_group_size=row_group, compression="zstd")
        total, docs, index = total + size, docs + len(texts), index + 1
    return {"documents": docs, "text_bytes": total, "files": index}


def baseline_loop(input_dir: Path, files: int) -> dict:
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
    for path in sorted(input_dir.glob("*.parquet"))[:files]:
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


def text_bytes(input_dir: Path, files: int) -> int:
    import pyarrow.parquet as pq

    return sum(len(t.encode("utf-8")) for p in sorted(input_dir.glob("*.parquet"))[:files]
               for t in pq.read_table(p, columns=["text"]).column(0).to_pylist())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--file-mb", type=int, default=64, help="text per input file")
    ap.add_argument("--row-group-docs", type=int, default=2048, help="documents per parquet row group")
    ap.add_argument("--task-mb", type=int, default=256, help="clean's --task-bytes, in MiB: a file is cut into "
                    "tasks of this many MiB of row groups")
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--baseline-files", type=int, default=0, help="the plain loop on the first N files (0: all)")
    ap.add_argument("--work-dir", type=Path, default=None, help="where the corpus is generated (default: a temp dir)")
    ap.add_argument("--baseline", type=Path, help=argparse.SUPPRESS)  # internal: the plain loop, in its own process
    args = ap.parse_args()
    if args.baseline:
        args.out.write_text(json.dumps(baseline_loop(args.baseline, args.baseline_files or 10**9)))
        return
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="clean-bench-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        corpus = make_corpus(work / "raw", args.size_mb, args.file_mb, row_group=args.row_group_docs)
        corpus["generate_seconds"] = time.perf_counter() - started
        print(json.dumps(corpus), flush=True)
        ours = run_measured([sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "clean", "--input-dir",
                             str(work / "raw"), "--output-dir", str(work / "clean"), "--config", str(CONFIG),
                             "--workers", str(args.cores), "--task-bytes", str(args.task_mb << 20)], work,
                            {"minhash": work / ".clean.clean-staging" / "minhash",
                             "exact_dedup": work / ".clean.clean-staging" / "exact"})
        manifest = json.loads((work / "clean" / "clean_manifest.json").read_text())
        ours |= {"documents_out": manifest["documents_out"], "cores": args.cores, "tasks": manifest["tasks"],
                 "steps": {s["step"]: s["removed"] for s in manifest["steps"]}}
        results = {"ours": ours}
        if not args.skip_baseline:
            base_out = work / "baseline.json"
            base = run_measured([sys.executable, __file__, "--baseline", str(work / "raw"), "--out", str(base_out),
                                 "--baseline-files", str(args.baseline_files)], work)
            base |= json.loads(base_out.read_text()) | {"cores": 1, "text_bytes": text_bytes(
                work / "raw", args.baseline_files or 10**9)}
            results["plain_loop"] = base
        ours |= {"documents_in": corpus["documents"], "text_bytes": corpus["text_bytes"]}
        for r in results.values():
            r["documents_per_s_per_core"] = r["documents_in"] / r["seconds"] / r["cores"]
            r["mb_per_s_per_core"] = r["text_bytes"] / 1e6 / r["seconds"] / r["cores"]
            r["documents_per_cpu_s"] = r["documents_in"] / r["cpu_seconds"]
            r["mb_per_cpu_s"] = r["text_bytes"] / 1e6 / r["cpu_seconds"]
        if "plain_loop" in results:
            results["ratio_ours_to_plain_loop"] = {
                key: results["ours"][key] / results["plain_loop"][key]
                for key in ("documents_per_s_per_core", "mb_per_s_per_core", "documents_per_cpu_s", "mb_per_cpu_s")}
    report = provenance(this_command()) | {
        "cpu": subprocess.run(["bash", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                              capture_output=True, text=True).stdout.strip(),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "setup": f"generated prose corpus, {args.cores} core(s) for ours (datatrove local executor), one process "
                 "for the plain loop (exact dedup + the same heuristics with datatrove's default word tokenizer, "
                 "no MinHash, no token counts"
                 + (f", on the first {args.baseline_files} file(s)" if args.baseline_files else "") + ")",
        "corpus": corpus, "results": results,
    }
    write_json(args.out, report)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
