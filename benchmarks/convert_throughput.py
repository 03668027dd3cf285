"""Converter throughput: our `kaiyuan data convert` against Megatron-LM's tools/preprocess_data.py on
the same documents (parquet for ours, the equivalent jsonl for theirs), the same tokenizer and the
same number of cores, at two input sizes. Reports tokens/s per core, peak RSS of the whole process
tree, and checks that both produce the same tokens.

usage: python benchmarks/convert_throughput.py --megatron-lm /path/to/Megatron-LM --out results.json
(Megatron-LM is a checkout fetched to a temporary directory; it is never committed.)"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_tree import run_measured  # noqa: E402

from kaiyuan_recipes.data.sample_corpus import CORPUS_DIR  # noqa: E402
from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir  # noqa: E402


def make_inputs(workdir: Path, target_mb: int, seed: int = 0) -> tuple[Path, Path, int]:
    docs = []
    for f in sorted(CORPUS_DIR.glob("*.parquet")):
        docs += pq.read_table(f, columns=["text"]).column("text").to_pylist()
    rng = random.Random(seed)
    out, size = [], 0
    while size < target_mb * 1_000_000:
        doc = rng.choice(docs)
        out.append(doc)
        size += len(doc.encode("utf-8"))
    pdir = workdir / f"parquet_{target_mb}mb"
    pdir.mkdir(parents=True)
    pq.write_table(pa.table({"text": out}), pdir / "input.parquet", row_group_size=2048, compression="zstd")
    jsonl = workdir / f"input_{target_mb}mb.jsonl"
    with open(jsonl, "w", encoding="utf-8") as fh:
        for doc in out:
            fh.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
    return pdir, jsonl, size


def tokens_of(prefix: Path):
    from kaiyuan_recipes import compat

    compat.apply()
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(str(prefix))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--megatron-lm", type=Path, required=True)
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--megatron-lm-revision", help="when the checkout is not a git repository")
    args = ap.parse_args()
    tok = default_tokenizer_dir()
    results = []
    with tempfile.TemporaryDirectory(prefix="convert-bench-") as tmp:
        work = Path(tmp)
        for mb in args.sizes_mb:
            pdir, jsonl, nbytes = make_inputs(work, mb)
            ours_out, theirs_out = work / f"ours_{mb}", work / f"theirs_{mb}"
            ours = run_measured(
                [sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "convert", "--input-dir", str(pdir),
                 "--output-dir", str(ours_out), "--tokenizer", str(tok), "--output-prefix", "bench",
                 "--num-shards", "1", "--workers-per-shard", str(args.cores)], work)
            theirs_out.mkdir()
            theirs = run_measured(
                [sys.executable, str(args.megatron_lm / "tools" / "preprocess_data.py"), "--input", str(jsonl),
                 "--output-prefix", str(theirs_out / "bench"), "--tokenizer-type", "HuggingFaceTokenizer",
                 "--tokenizer-model", str(tok), "--workers", str(args.cores), "--append-eod"], work)
            a = tokens_of(ours_out / "bench_part-00000_text_document")
            b = tokens_of(theirs_out / "bench_text_document")
            n_tokens = int(a.sequence_lengths.sum())
            identical = len(a) == len(b) and all((a[i] == b[i]).all() for i in range(len(a)))
            for r in (ours, theirs):
                r["tokens_per_s_per_core"] = n_tokens / r["seconds"] / args.cores
            results.append({
                "input_mb": round(nbytes / 1e6, 1), "documents": len(a), "tokens": n_tokens,
                "ours": ours, "megatron_lm": theirs, "identical_tokens": identical,
                "speedup_vs_megatron": ours["tokens_per_s_per_core"] / theirs["tokens_per_s_per_core"],
            })
            print(json.dumps(results[-1], indent=1), flush=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    mlm_rev = subprocess.run(["git", "-C", str(args.megatron_lm), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
    report = {
        "command": "python " + " ".join(sys.argv),
        "revision": rev,
        "megatron_lm_revision": args.megatron_lm_revision or mlm_rev or "unknown",
        "host": {"platform": platform.platform(), "cores": args.cores, "cpu": platform.processor(),
                 "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d"),
        "setup": "same documents (bundled sample corpus, shuffled and repeated), same tokenizer (bundled Qwen2 BPE), "
                 f"EOD appended, {args.cores} cores: ours 1 file x {args.cores} tokenizer threads, "
                 f"Megatron-LM --workers {args.cores}",
        "results": results,
        "speedup_vs_megatron": min(r["speedup_vs_megatron"] for r in results),
        "peak_rss_growth_ours": results[-1]["ours"]["peak_rss_mb"] / results[0]["ours"]["peak_rss_mb"],
        "peak_rss_growth_megatron": (results[-1]["megatron_lm"]["peak_rss_mb"]
                                     / results[0]["megatron_lm"]["peak_rss_mb"]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "results"}, indent=1))


if __name__ == "__main__":
    main()
