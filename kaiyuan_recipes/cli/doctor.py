"""`kaiyuan doctor`: this host's stack, whether it is tested, what applies and what `auto` picks here, what each
optional feature lacks (kaiyuan_recipes/doctor.py); a rich table or --json. Exit 1 on an untested or missing stack."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("doctor", help="the detected stack, whether it is tested, what `auto` picks here (exit 1 if "
                                      "untested)")
    p.add_argument("--recipe", default="gpt_smoke", help="recipe whose `auto` plan to resolve (default gpt_smoke)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=doctor)


def doctor(args: Any) -> int:
    from kaiyuan_recipes.doctor import diagnose

    with contextlib.redirect_stdout(sys.stderr):  # upstream's import noise; stdout is the report's (--json)
        report = diagnose(recipe=args.recipe, progress=lambda step: print(f"kaiyuan doctor: checking {step} ...",
                                                                          file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
    else:
        render(report)
    return report.exit_code


def _mark(flag: bool | None) -> str:
    return {True: "[green]yes[/]", False: "[dim]no[/]", None: "[dim]-[/]"}[flag]


def render(report: Any, console: Any = None) -> None:
    from rich.console import Console
    from rich.markup import escape  # this table uses markup; paths and error text are escaped
    from rich.table import Table

    console = console or Console(width=120)
    v = report.packages
    stack = Table(title="kaiyuan doctor: stack", show_header=False)
    stack.add_row("python", f"{report.python} ({escape(str(report.executable))})")
    stack.add_row("torch", f"{v['torch'] or 'not installed'}, CUDA {report.torch_cuda or '-'}")
    stack.add_row("GPUs", f"{len(report.gpus)}: {', '.join(report.gpus)}" if report.gpus else "none visible to torch")
    te = v["transformer-engine"]
    stack.add_row("transformer-engine", f"{te} (not importable)" if te and not report.transformer_engine_importable
                  else te or "not installed")
    stack.add_row("apex", v["apex"] or ("importable" if report.apex_importable else "not installed"))
    for dist in ("megatron-core", "megatron-bridge", "transformers", "nemo-toolkit", "nemo-run", "triton"):
        stack.add_row(dist, v[dist] or "[dim]not installed[/]")
    console.print(stack)

    verdict = report.verdict
    colour = "green" if verdict.tested else "red"
    console.print(f"stack: [bold {colour}]{'tested' if verdict.tested else 'NOT TESTED'}[/], {verdict.message}")

    compat = Table(title="compat workarounds (kaiyuan_recipes/compat)")
    compat.add_column("function", no_wrap=True)
    for col in ("upstream, versions", "applies here", "detail"):
        compat.add_column(col)
    for item in report.compat:
        compat.add_row(item.function, f"{item.upstream} {item.versions}", _mark(item.applies), item.detail)
    console.print(compat)

    auto = report.auto
    if auto is None:
        console.print("`auto` plan: not resolved (needs megatron-bridge: the Bridge environment, `make env`)")
    elif auto.error:
        console.print(f"[red]`auto` plan for {auto.recipe}: the dry build failed[/]: {escape(str(auto.error))}")
    else:
        plan = Table(title=f"what `auto` picks here ({auto.recipe}, dry build)")
        plan.add_column("piece")
        plan.add_column("decision")
        plan.add_row("layer_spec", f"{auto.layer_spec} ({auto.layer_spec_reason})")
        for piece, decision in auto.fastpath.items():
            plan.add_row(piece, decision)
        console.print(plan)

    feats = Table(title="optional features")
    for col in ("feature", "ready", "missing", "how"):
        feats.add_column(col)
    for f in report.features:
        feats.add_row(f.name, _mark(f.ready), ", ".join(f.missing) or "-", f.how)
    console.print(feats)
