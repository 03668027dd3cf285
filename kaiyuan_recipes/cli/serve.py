"""`kaiyuan serve`: serve a HF directory or a Megatron checkpoint (exported first) over HTTP
(kaiyuan_exporters.serving): Megatron's `PUT /api` and OpenAI `POST /v1/completions`, on uvicorn."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="inference server: PUT /api (Megatron) and POST /v1/completions (OpenAI)")
    p.add_argument("model", type=Path, help="HF model directory, or a Megatron run / checkpoint directory")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--decode-mode", choices=["graph", "reduce-overhead", "eager"],
                   help="decode step: graph (compiled, one CUDA graph per batch / cache length; the CUDA "
                        "default), reduce-overhead (torch.compile's CUDA graphs), eager (the CPU default)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20,
                   help="larger request bodies (declared or chunked) are a 413 (default 1 MiB)")
    p.add_argument("--body-timeout-s", type=float, default=30.0,
                   help="a request body not received within this many seconds is a 408 (default 30)")
    p.add_argument("--max-tokens", type=int,
                   help="the most new tokens a request may ask for (default: the model's positions less one, "
                        "at most 4096)")
    p.add_argument("--model-name", default="kaiyuan",
                   help="the name GET /v1/models reports and requests' `model` must match (default: kaiyuan)")
    p.add_argument("--api-token-env", metavar="VAR",
                   help="require 'Authorization: Bearer <token>', the token read from environment variable VAR")
    p.set_defaults(func=serve)


def serve(args: Any) -> int:
    import uvicorn
    from kaiyuan_exporters.megatron_to_hf import as_hf_dir
    from kaiyuan_exporters.serving.api import create_app
    from kaiyuan_exporters.serving.engine import GenerationEngine

    token = None
    if args.api_token_env:
        token = os.environ.get(args.api_token_env)
        if not token:
            raise ValueError(f"--api-token-env {args.api_token_env}: that environment variable is empty or unset")
    hf_dir = as_hf_dir(args.model)
    engine = GenerationEngine(hf_dir, args.device, args.max_batch_size, decode_mode=args.decode_mode)
    app = create_app(engine, token, args.max_body_bytes, model_name=args.model_name,
                     body_timeout_s=args.body_timeout_s, max_tokens=args.max_tokens)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", access_log=False)
    return 0
