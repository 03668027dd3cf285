"""Single kernels timed on the GPU (tests/gpu/test_fast_spec_gpu.py, test_decode_gpu.py) and the local-spec settings
needed without TE / Apex."""

from __future__ import annotations

import re

from resultsdoc.entries import Data
from resultsdoc.formatting import n0


def _printed(d: Data, prefix: str) -> str:
    return next(line for line in d["printed"] if line.startswith(prefix))


def kernels_rows(d: Data) -> list[list[str]]:
    ce = re.search(r"(\d[\d,]*) tokens: chunked ([\d.]+) ms ([\d.]+) GiB.*full ([\d.]+) ms ([\d.]+) GiB, full_masked",
                   _printed(d, "lm head"))
    rope_line = _printed(d, "RoPE")
    rope = re.search(r"compiled ([\d.]+) ms, unfused ([\d.]+) ms", rope_line)
    swiglu_line = _printed(d, "SwiGLU")
    swiglu = re.search(r"kernel ([\d.]+) ms, upstream ([\d.]+) ms", swiglu_line)
    wgrad_line = _printed(d, "wgrad")
    wgrad = re.search(r"fused ([\d.e-]+), unfused ([\d.e-]+) \(of ([\d.]+)\); fused ([\d.]+) ms, unfused ([\d.]+) ms",
                      wgrad_line)
    shape = re.search(r"^[^,]+, (.+?):", rope_line).group(1)
    return [
        [f"lm head + cross-entropy fwd+bwd, {n0(int(ce.group(1)))} tokens", f"chunked {ce.group(2)} ms, "
         f"{ce.group(3)} GiB", f"full logits {ce.group(4)} ms, {ce.group(5)} GiB"],
        [f"RoPE, {shape}", f"compiled {rope.group(1)} ms", f"unfused {rope.group(2)} ms"],
        [f"SwiGLU backward, {re.search(r'^[^,]+, (.+?):', swiglu_line).group(1)}", f"kernel {swiglu.group(1)} ms",
         f"upstream {swiglu.group(2)} ms"],
        [f"wgrad accumulate, {re.search(r'^[^,]+, (.+?):', wgrad_line).group(1)}",
         f"fused {wgrad.group(4)} ms, max error vs fp32 {wgrad.group(1)}",
         f"unfused {wgrad.group(5)} ms, {wgrad.group(2)} (of {wgrad.group(3)})"],
    ]


def decode_rows(d: Data) -> list[list[str]]:
    e, a = d["experts_fwd_bwd_65536_routed_tokens_ms"], d["attention_seq4096_16q_4kv_heads_ms"]
    return [
        ["MoE experts fwd+bwd, 65,536 routed tokens",
         f"grouped {e['grouped']}, sequential {e['sequential']} ({e['speedup']}×)"],
        ["attention, seq 4096, 16 q / 4 kv heads",
         f"local fwd {a['local_fwd']}; SDPA auto {a['sdpa_auto']['fwd']} fwd, {a['sdpa_auto']['fwd_bwd']} fwd+bwd; "
         f"cuDNN first {a['sdpa_cudnn_first']['fwd']} / {a['sdpa_cudnn_first']['fwd_bwd']}; flash first "
         f"{a['sdpa_flash_first']['fwd']} / {a['sdpa_flash_first']['fwd_bwd']}"],
    ]


def compiled_norm(d: Data) -> str:
    err = d["max_abs_error_vs_fp32_bf16"]
    hidden = next(v for k, v in err.items() if "hidden" in k)
    qnorm = next(v for k, v in err.items() if "q norm" in k)
    same = all(hidden[k]["compiled"] == hidden[k]["torch"] for k in ("output", "input grad", "weight grad"))
    return (f"{d['result']}. Against an fp32 RMSNorm of the same weights, the compiled RMSNorm's bf16 error "
            f"{'equals' if same else 'differs from'} torch's on the hidden states (output, input and weight "
            f"gradients) and on the q norm's weight gradient is {qnorm['weight grad']['compiled']} vs torch's "
            f"{qnorm['weight grad']['torch']}.")


def local_spec_compat(d: Data) -> str:
    needed = [k for k, v in d["conclusion"].items() if v.startswith("needed")]
    outcomes = ", ".join(f"{k} {v}" for k, v in d["results"].items())
    return (f"Of the local-spec settings, only {', '.join(f'`{k}=false`' for k in needed)} is needed without "
            f"TE / Apex (test outcomes: {outcomes}; a FAILED revert test means upstream's default trains).")
