"""`kaiyuan serve`: serve a HF directory or a Megatron checkpoint (exported first) over HTTP
(kaiyuan_recipes.serve): Megatron's `PUT /api` and OpenAI `POST /v1/completions`, on uvicorn."""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

# --decode-mode: (capture CUDA graphs, compile the step) at warm-up
DECODE_MODES = {"compiled": (True, True), "graph": (True, False), "eager": (False, False)}
# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms). The decode worker gives
# the GIL up in every torch call (a step's wait for the GPU, each eager op of a prefill) and takes it back after:
# with the HTTP event loop busy, each take-back could wait the whole interval, in a step of a few ms.
GIL_SWITCH_INTERVAL_S = 0.0005


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="inference server: PUT /api (Megatron) and POST /v1/completions (OpenAI)")
    p.add_argument("model", type=Path, help="HF model directory, or a Megatron run / checkpoint directory")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=5000, help="0 to 65535 (0: any free port, said in the log)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--max-batch", "--max-batch-size", dest="max_batch", type=int, default=32,
                   help="the envelope: at most this many requests decode at once (more queue; default 32)")
    p.add_argument("--max-seq-len", type=int,
                   help="the envelope: prompt + new tokens of one request, at most (default: the model's "
                        "positions, at most 4096); beyond it a request is a 400; the KV cache is sized by both")
    p.add_argument("--decode-mode", choices=DECODE_MODES,
                   help="compiled (the CUDA default): one decoder layer compiled (torch.compile) for all "
                        "layers, then every bucketed (batch, cache length) decode step captured into a CUDA graph "
                        "at start-up, nothing compiled or captured while serving; graph: the eager step captured "
                        "the same way (a shorter start-up, slower at batch 1); eager (the CPU default). A compiled "
                        "step that fails is captured eagerly instead; a step that cannot be captured (a MoE's "
                        "expert loop) decodes eagerly; both said in the log and in /health")
    p.add_argument("--join-min-rows", type=int, default=0,
                   help="waiting requests join the decoding batch once this many wait (default: an eighth of "
                        "--max-batch), or once the oldest has waited --join-max-wait-s: each join is one prefill "
                        "that stalls the batch")
    p.add_argument("--join-max-wait-s", type=float, default=0.25,
                   help="seconds the oldest waiting request waits before it joins the batch anyway (default 0.25)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="unfinished requests (each prompt x n choice is one) the server holds beyond --max-batch, "
                        "waiting or being scored; a request that would pass it is a 429 (default 256; a request "
                        "larger than the whole bound is served when nothing else is)")
    p.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="on SIGTERM: in-flight requests get this long to finish, then fail with a 503 "
                        "(default 30); the process exits within this plus 5 s")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20,
                   help="larger request bodies (declared or chunked) are a 413 (default 1 MiB)")
    p.add_argument("--body-timeout-s", type=float, default=30.0,
                   help="a request body not received within this many seconds is a 408 (default 30)")
    p.add_argument("--header-timeout-s", type=float, default=10.0,
                   help="a connection that has not sent a whole request line and headers within this many seconds "
                        "of connecting, or of its last answer, is closed (default 10)")
    p.add_argument("--idle-timeout-s", type=float, default=5.0,
                   help="a kept-alive connection with no new request for this many seconds is closed (default 5)")
    p.add_argument("--max-tokens", type=int,
                   help="the most new tokens a request may ask for (default: the model's positions less one, "
                        "at most 4096)")
    p.add_argument("--model-name", default="kaiyuan",
                   help="the name GET /v1/models reports and requests' `model` must match (default: kaiyuan)")
    p.add_argument("--api-token-env", metavar="VAR",
                   help="require 'Authorization: Bearer <token>', the token read from environment variable VAR")
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                   help="weights and activations: auto = bfloat16 on CUDA, float32 on the CPU; float32 on CUDA "
                        "scores as transformers does in fp32 (lm-eval parity checks)")
    p.set_defaults(func=serve)


# option: smallest value allowed, whether the smallest itself is allowed
LIMITS = {"max_batch": (1, True), "max_seq_len": (2, True), "join_min_rows": (0, True),
          "join_max_wait_s": (0, True), "max_queue": (0, True), "drain_timeout_s": (0, True),
          "max_body_bytes": (1, True), "body_timeout_s": (0, False), "header_timeout_s": (0, False),
          "idle_timeout_s": (0, False), "max_tokens": (1, True)}


def check_options(args: Any) -> None:
    """Every numeric option in its range (finite), before anything loads: a ValueError naming the option."""
    for name, (low, inclusive) in LIMITS.items():
        value = getattr(args, name)
        if value is None:
            continue
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            bound = f"at least {low}" if inclusive else f"more than {low}"
            raise ValueError(f"--{name.replace('_', '-')} {value}: must be {bound}")


def serve(args: Any) -> int:
    from kaiyuan_recipes.config.run_layout import require_model_dir

    check_options(args)
    require_model_dir(args.model)
    from kaiyuan_recipes.serve import server

    logging.getLogger("kaiyuan_recipes.serve").setLevel(logging.INFO)  # warm-up progress, the server's state
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    token = None
    if args.api_token_env:
        token = os.environ.get(args.api_token_env)
        if not token:
            raise ValueError(f"--api-token-env {args.api_token_env}: that environment variable is empty or unset")
    sock = server.bind(args.host, args.port)  # before the model loads: a port that cannot be used fails first
    try:
        engine, app = _engine_and_app(args, token)
    except BaseException:
        sock.close()
        raise
    server.run(app, engine, sock, args.drain_timeout_s, args.header_timeout_s, args.idle_timeout_s)
    return 0


def _engine_and_app(args: Any, token: str | None) -> tuple[Any, Any]:
    import torch
    from transformers import AutoConfig

    from kaiyuan_recipes.export.megatron_to_hf import as_hf_dir
    from kaiyuan_recipes.serve.app import create_app
    from kaiyuan_recipes.serve.batch_decoder import Envelope
    from kaiyuan_recipes.serve.engine import DEFAULT_MAX_SEQ_LEN, GenerationEngine, JoinPolicy

    # a Megatron run is exported first, to a temporary directory that lives until the engine has loaded the model
    with as_hf_dir(args.model) as hf_dir:
        positions = getattr(AutoConfig.from_pretrained(str(hf_dir)), "max_position_embeddings", DEFAULT_MAX_SEQ_LEN)
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        mode = args.decode_mode or ("compiled" if device.startswith("cuda") else "eager")
        capture, compile_step = DECODE_MODES[mode]
        if capture and not device.startswith("cuda"):
            raise ValueError(f"--decode-mode {mode} needs a CUDA device (it captures CUDA graphs), got {device!r}")
        envelope = Envelope(args.max_batch, args.max_seq_len or min(positions, DEFAULT_MAX_SEQ_LEN), capture,
                            compile_step)
        join = JoinPolicy(args.join_min_rows, args.join_max_wait_s)
        # warms up in its worker; /health: when ready
        dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
        engine = GenerationEngine(hf_dir, device, envelope, join=join, max_queue=args.max_queue, dtype=dtype)
    try:
        app = create_app(engine, token, args.max_body_bytes, model_name=args.model_name,
                         body_timeout_s=args.body_timeout_s, max_tokens=args.max_tokens)
    except BaseException:
        engine.close()  # its worker ends before the interpreter does
        raise
    return engine, app
