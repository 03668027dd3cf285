"""Generation throughput, side by side in one run: two transformers baselines, `generate` as people call it
(dynamic cache, eager) and transformers' own fast path (a static cache with its automatic torch.compile of the
decode step), against `kaiyuan serve`'s engine in each decode mode (compiled, the CUDA default: the batch
decoder's step compiled and captured into CUDA graphs at warm-up; graph: the eager step captured; eager), same
weights, greedy, prompt 128 tokens, 256 new tokens, batch 1 and 32. Every side gets the same treatment: one
untimed call first (what compiles or captures does it there), then --repeats timed calls, reported by their
median. Outputs are compared token for token (bf16), and in fp32 against generate. With --sampled, every side
samples instead (temperature 0.8, top-p 0.95; throughput only).

usage: python benchmarks/generation.py HF_DIR --out generation.json [--sampled]
       (HF_DIR: an exported model; --random-qwen3 DIR writes a random-weight qwen3_1p7b there first)"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance, this_command, write_json  # noqa: E402

from kaiyuan_recipes.cli.serve import DECODE_MODES  # noqa: E402

# kaiyuan serve's decode modes as (capture, compile, regional), and the whole-forward compilation that compiled mode
# replaced (one decoder layer compiled for all), to compare
MODES = {**{mode: (*flags, True) for mode, flags in DECODE_MODES.items()}, "compiled_whole": (True, True, False)}


def prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    from kaiyuan_recipes.data.sample_corpus import SOURCES, sample_texts

    texts = [t for name in SOURCES for t in sample_texts(name)]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return [i[:length] for i in ids if len(i) >= length][:count]


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - start


SAMPLED = dict(temperature=0.8, top_p=0.95)


# The transformers sides: their generate() settings.
HF_BASELINES = {
    "hf_generate": dict(disable_compile=True),  # dynamic cache, eager: generate as people call it
    "hf_static_compiled": dict(cache_implementation="static"),  # transformers compiles the step for a static cache
}


def hf_generate(model, batch: list[list[int]], new_tokens: int, sampled: bool = False,
                baseline: str = "hf_generate") -> list[list[int]]:
    ids = torch.tensor(batch, device="cuda")
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, pad_token_id=151643, **HF_BASELINES[baseline],
                         **(dict(do_sample=True, top_k=None, **SAMPLED) if sampled else dict(do_sample=False)))
    return out[:, ids.shape[1]:].tolist()


def warm_median(fn, repeats: int):
    """One untimed call, then `repeats` timed ones: (the last output, the median seconds, every timing)."""
    fn()
    times, out = [], None
    for _ in range(repeats):
        out, seconds = timed(fn)
        times.append(seconds)
    return out, statistics.median(times), times


def write_random_qwen3(path: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir
    from kaiyuan_recipes.models.shape import ModelShape

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(ModelShape.for_recipe("qwen3_1p7b").hf_config(151646),
                                             dtype=torch.bfloat16)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(str(default_tokenizer_dir())).save_pretrained(path)
    return path


def fp32_agreement(hf_dir: Path, batch: list[list[int]], new_tokens: int) -> dict:
    """In fp32 (no bf16 near-ties), the default (compiled) batch decoder against transformers' generate, same
    weights."""
    from transformers import AutoModelForCausalLM

    from kaiyuan_recipes.serve.batch_decoder import Envelope
    from kaiyuan_recipes.serve.engine import GenerationEngine, Request

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).cuda().eval()
    ref = hf_generate(model, batch, new_tokens)
    del model
    engine = GenerationEngine(hf_dir, "cuda", Envelope(len(batch), 1024, *DECODE_MODES["compiled"]), torch.float32)
    ours = [c.token_ids for c in engine.generate([Request(p, new_tokens, ignore_eos=True) for p in batch])]
    engine.close()
    del engine
    torch.cuda.empty_cache()
    return {"rows": len(batch), "new_tokens": new_tokens, "identical_rows": sum(a == b for a, b in zip(ours, ref))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir", type=Path, nargs="?")
    ap.add_argument("--random-qwen3", type=Path, help="write a random-weight qwen3_1p7b here and use it")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--modes", nargs="+", default=["compiled", "graph"], choices=list(MODES),
                    help="kaiyuan serve's decode modes, and compiled_whole (the whole forward compiled)")
    ap.add_argument("--sampled", action="store_true", help="sample on both sides (throughput; no fp32 check)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per side after the untimed one")
    ap.add_argument("--baselines", nargs="+", default=list(HF_BASELINES), choices=list(HF_BASELINES))
    args = ap.parse_args()
    began = time.perf_counter()  # progress lines: where a run cut short was
    from transformers import AutoModelForCausalLM

    from kaiyuan_recipes.serve.batch_decoder import Envelope
    from kaiyuan_recipes.serve.engine import GenerationEngine, Request, Sampling

    hf_dir = write_random_qwen3(args.random_qwen3) if args.random_qwen3 else args.hf_dir
    envelope = Envelope(max(args.batch_sizes), -(-(args.prompt_len + args.new_tokens) // 256) * 256)
    engines = {}
    for mode in args.modes:  # one at a time: a warm-up's CUDA graph captures must not overlap another's
        print(f"warming up ours, {mode} at {time.perf_counter() - began:.0f} s", flush=True)
        engines[mode] = GenerationEngine(hf_dir, "cuda", Envelope(envelope.max_batch, envelope.max_seq_len,
                                                                  *MODES[mode]))
        while not engines[mode].ready.wait(5):  # bounded by the engine: ready, or failed (its log says why)
            if engines[mode].failure is not None:
                raise SystemExit(f"{mode}: warm-up failed: {engines[mode].failure}")
    engine = engines[args.modes[0]]
    baseline = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.bfloat16).cuda().eval()
    all_prompts = prompts(engine.tokenizer, max(args.batch_sizes), args.prompt_len)
    results = {}
    for bs in args.batch_sizes:
        batch = all_prompts[:bs]
        sampling = Sampling(seed=0, **SAMPLED) if args.sampled else Sampling()
        requests = lambda: [Request(p, args.new_tokens, sampling, ignore_eos=True) for p in batch]  # noqa: E731
        row, ref, peers = {}, None, {}
        for name in args.baselines:
            print(f"batch {bs}: {name} (its first call compiles, if it does) at {time.perf_counter() - began:.0f} s",
                  flush=True)
            with torch.inference_mode():
                out, median_s, times = warm_median(
                    lambda: hf_generate(baseline, batch, args.new_tokens, args.sampled, name), args.repeats)
            ref = out if name == "hf_generate" else ref  # the token-for-token reference: plain generate
            peers[name] = median_s
            row[name] = {"tokens_per_s": bs * args.new_tokens / median_s, "timings_s": times}
        ref = ref if ref is not None else out
        for mode, engine in engines.items():
            print(f"batch {bs}: ours, {mode} at {time.perf_counter() - began:.0f} s", flush=True)
            _, first_s = timed(lambda: engine.generate(requests()))  # nothing compiles or captures: warmed up
            ours, ours_s, times = warm_median(lambda: engine.generate(requests()), args.repeats)
            ours = [c.token_ids for c in ours]
            first_diff = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(ours, ref)]
            row[mode] = {
                "tokens_per_s": bs * args.new_tokens / ours_s,
                "timings_s": times,
                **{f"speedup_vs_{name}": seconds / ours_s for name, seconds in peers.items()},
                "graphs_in_use": bool(engine.decoder.graphs),  # false after a capture fallback
                "warm_up_s": engine.warmup.seconds,
                "first_call_s": first_s,
                **({} if args.sampled else {
                    "identical_rows_bf16": sum(a == b for a, b in zip(ours, ref)) / bs,
                    "mean_tokens_before_first_difference_bf16": sum(first_diff) / bs}),
            }
        print(bs, row, flush=True)
        results[f"batch_{bs}"] = row
        report(args, hf_dir, results, None, complete=False)  # a run cut short keeps its finished rows
    baseline = None  # frees the bf16 copies before the fp32 one is loaded
    for engine in engines.values():
        engine.close()
    engines = engine = None
    agreement = None if args.sampled else fp32_agreement(hf_dir, all_prompts[:4], 64)
    print("fp32", agreement, flush=True)
    report(args, hf_dir, results, agreement, complete=True)


def report(args, hf_dir, results: dict, agreement: dict | None, complete: bool) -> None:
    write_json(args.out, {**provenance(this_command()), "model": str(hf_dir),
                          "prompt_tokens": args.prompt_len, "new_tokens": args.new_tokens,
                          "greedy": not args.sampled, "sampling": SAMPLED if args.sampled else None,
                          "ours": "kaiyuan_recipes.serve.engine (batch_decoder.py) per mode: compiled = one "
                                  "decoder layer through torch.compile for all layers, the step then captured "
                                  "into a CUDA graph per bucketed (batch, cache length) at warm-up; "
                                  "compiled_whole = the whole forward compiled instead; graph = the eager step "
                                  "captured the same way; eager = no graphs",
                          "baselines": {"hf_generate": "transformers generate, dynamic cache, eager, SDPA",
                                        "hf_static_compiled": "transformers generate, static cache, its own "
                                                              "torch.compile of the decode step"},
                          "statistic": f"median of {args.repeats} timed calls after one untimed call, every side",
                          "targets_tokens_per_s": {"batch_1": 300, "batch_32": 5000},
                          "results": results, "fp32_agreement_with_hf_generate": agreement,
                          "complete": complete})


if __name__ == "__main__":
    main()
