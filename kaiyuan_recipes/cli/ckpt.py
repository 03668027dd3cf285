"""`kaiyuan ckpt ls | inspect | verify | diff`: parse, call kaiyuan_recipes.ckpt, print (rich) or --json."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    ck = sub.add_parser("ckpt", help="list, inspect, verify and diff checkpoints (CPU, from their metadata)")
    csub = ck.add_subparsers(dest="ckpt_cmd", required=True)
    ls = csub.add_parser("ls", help="a run's saved iterations: size, time, samples, optimizer, latest, keep-last-K")
    ls.add_argument("run", type=Path, help="run directory or its checkpoints/ folder")
    ls.add_argument("--json", action="store_true", help="print the report as JSON")
    ls.set_defaults(func=ls_cmd)
    ins = csub.add_parser("inspect", help="recipe, shape, knobs, tensors by module, parallel layout, load targets")
    ins.add_argument("ckpt", type=Path, help="an iter_* directory, or a run (the iteration its tracker names)")
    ins.add_argument("--tensors", metavar="PATTERN",
                     help="list tensors whose key matches (glob; plain text: substring)")
    ins.add_argument("--json", action="store_true", help="print the report as JSON")
    ins.set_defaults(func=inspect_cmd)
    ve = csub.add_parser("verify", help="every shard file present and complete, every tensor loadable (exit 1 if not)")
    ve.add_argument("ckpt", type=Path, help="an iter_* directory, or a run (the iteration its tracker names)")
    ve.add_argument("--json", action="store_true", help="print the report as JSON")
    ve.set_defaults(func=verify_cmd)
    di = csub.add_parser("diff", help="per-tensor max |Δ| and relative norm, grouped (exit 1 if they differ)")
    di.add_argument("a", type=Path, help="the reference checkpoint (‖A‖ in the relative norm)")
    di.add_argument("b", type=Path, help="the one compared with it (any DP chunking)")
    di.add_argument("--top", type=int, default=20, help="differing tensors to list (default 20; --json lists all)")
    di.add_argument("--json", action="store_true", help="print the report as JSON")
    di.set_defaults(func=diff_cmd)


def _json(result: Any) -> None:
    def clean(x: Any) -> Any:  # NaN is not JSON
        return None if isinstance(x, float) and math.isnan(x) else x

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return clean(x)

    print(json.dumps(walk(dataclasses.asdict(result)), indent=2, default=str))


def size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _num(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _console() -> Any:
    from rich.console import Console

    # Piped or captured: wide enough that keys and paths are not cut (a terminal keeps its own width).
    # Markup off: paths and tensor keys are the user's text, and `[/x]` in one would read as a closing tag.
    return Console(markup=False) if sys.stdout.isatty() else Console(width=160, markup=False)


def _table(title: str | None = None, *columns: str, **kw: Any) -> Any:
    from rich.table import Table

    table = Table(title=title, **kw)
    for c in columns:
        table.add_column(c, justify="right" if c in ("iteration", "size", "samples", "tokens", "tensors",
                                                     "parameters", "bytes", "max |Δ|", "‖Δ‖/‖A‖", "keys",
                                                     "differ", "missing") else "left")
    return table


def ls_cmd(args: Any) -> int:
    from kaiyuan_recipes.ckpt.listing import list_checkpoints

    listing = list_checkpoints(args.run)
    if args.json:
        _json(listing)
        return 0
    k = listing.most_recent_k
    table = _table(f"{listing.root}  (keep-last-K: {'all' if k is not None and k < 0 else k})", "iteration", "size",
                   "saved (UTC)", "samples", "tokens", "optimizer", "format", "state")
    for e in listing.checkpoints:
        state = ", ".join(s for s, on in (("latest", e.latest), ("deleted by next save", e.deleted_next),
                                          ("incomplete", not e.complete)) if on)
        table.add_row(str(e.iteration), size(e.disk_bytes), (e.saved_at or "-").replace("+00:00", ""),
                      _num(e.consumed_samples), _num(e.consumed_tokens),
                      "-" if e.has_optimizer is None else ("yes" if e.has_optimizer else "no"), e.format or "-", state)
    console = _console()
    console.print(table)
    for note in listing.notes:
        console.print(f"note: {note}")
    return 0


def inspect_cmd(args: Any) -> int:
    from kaiyuan_recipes.ckpt.inspect import inspect_checkpoint

    report = inspect_checkpoint(args.ckpt, args.tensors)
    if args.json:
        _json(report)
        return 0
    console = _console()
    lay, ts = report.layout, report.train_state or {}
    summary = _table(report.path, "", "", show_header=False)
    summary.add_row("format", f"{report.format}, {size(report.disk_bytes)} on disk")
    summary.add_row("recipe", f"{report.recipe or 'unknown'}  ({report.recipe_source})")
    summary.add_row("iteration", f"{report.iteration}  (consumed samples {_num(ts.get('consumed_train_samples'))})")
    summary.add_row("model", ", ".join(f"{k}={v}" for k, v in report.model.items()))
    summary.add_row("knobs", ", ".join(f"{k}={v}" for k, v in report.knobs.items() if v is not None) or "-")
    summary.add_row("saved with", f"TP={lay.tensor} PP={lay.pipeline} CP={lay.context} EP={lay.expert} "
                                  f"DP={lay.data or '?'} ZeRO={lay.zero_stage} "
                                  f"optimizer={lay.optimizer_sharding or 'none'} ({lay.writer_ranks} writer rank(s))")
    if report.run_plan:
        summary.add_row("run's plan", ", ".join(f"{k}={v}" for k, v in report.run_plan.items()))
    lt = report.loadable
    summary.add_row("loads into", f"resume with another DP: {'yes' if lt.resume_other_dp else 'no'}; "
                                  f"another TP/PP: {'yes' if lt.resume_other_tp_pp else 'no'}; "
                                  f"export hf: {'yes' if lt.export_hf else 'no'}\n" + "\n".join(lt.reasons))
    console.print(summary)
    groups = _table("tensors by module", "group", "tensors", "parameters", "bytes", "dtype")
    for g in report.groups:
        groups.add_row(g.name, str(g.tensors), _num(g.parameters), size(g.bytes), ", ".join(g.dtypes))
    console.print(groups)
    if args.tensors is not None:
        matched = _table(f"tensors matching {args.tensors!r}: {len(report.tensors)}", "key", "shape", "dtype", "bytes")
        for t in report.tensors:
            matched.add_row(t.key, str(t.shape), t.dtype, size(t.bytes))
        console.print(matched)
    return 0


def verify_cmd(args: Any) -> int:
    from kaiyuan_recipes.ckpt.verify import verify_checkpoint

    report = verify_checkpoint(args.ckpt, show_progress=not args.json and sys.stderr.isatty())
    if args.json:
        _json(report)
    elif report.ok:
        print(f"{report.path}: ok ({report.format}; {len(report.files)} shard file(s), {report.tensors_checked} "
              f"tensors and {report.objects_checked} objects loaded, {size(report.bytes_read)} read)")
    for name in report.nonfinite:
        print(f"warning: {name}: holds NaN / Inf values", file=sys.stderr)
    if report.problems:
        first = report.problems[0]
        print(f"kaiyuan: error: {first.file}: {first.what}", file=sys.stderr)
        for p in report.problems[1:]:
            print(f"  also: {p.file}: {p.what}", file=sys.stderr)
        return 1
    return 0


def _g(x: float) -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else f"{x:.3g}"


def diff_cmd(args: Any) -> int:
    from kaiyuan_recipes.ckpt.diff import diff_checkpoints

    report = diff_checkpoints(args.a, args.b, show_progress=not args.json and sys.stderr.isatty())
    if args.json:
        _json(report)
        return 0 if report.identical else 1
    console = _console()
    groups = _table(f"A {report.a}\nB {report.b}", "group", "keys", "differ", "missing", "max |Δ|", "‖Δ‖/‖A‖")
    for g in report.groups:
        groups.add_row(g.name, str(g.keys), str(g.differ), str(g.missing), _g(g.max_abs), _g(g.rel_norm))
    console.print(groups)
    # Largest relative change first; uncomparable ones (NaN: shape or dtype differ) at the top.
    differing = sorted((t for t in report.tensors if not t.equal),
                       key=lambda t: -math.inf if math.isnan(t.rel_norm) else -t.rel_norm)
    if differing:
        tensors = _table(f"differing tensors ({len(differing)}, largest ‖Δ‖/‖A‖ first)", "key", "max |Δ|", "‖Δ‖/‖A‖")
        for t in differing[:args.top]:
            tensors.add_row(t.key + (f"  ({t.note})" if t.note else ""), _g(t.max_abs), _g(t.rel_norm))
        console.print(tensors)
    for o in report.objects:
        if not o.equal:
            changes = o.changes or [f"{o.a} -> {o.b}"]
            console.print(f"{o.key} differs (A -> B):\n" + "\n".join(f"  {c}" for c in changes), markup=False,
                          highlight=False)
    for side, keys in (("A", report.only_in_a), ("B", report.only_in_b)):
        if keys:
            console.print(f"only in {side}: {', '.join(keys)}")
    console.print("identical" if report.identical else "they differ")
    return 0 if report.identical else 1
