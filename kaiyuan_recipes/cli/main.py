"""The `kaiyuan` command: parses arguments and dispatches; the work lives in the sub-packages."""

from __future__ import annotations

import argparse
import logging
import sys

from kaiyuan_recipes import __version__
from kaiyuan_recipes.cli import average, ckpt, cluster, data, doctor, evaluate, export, lifecycle, models, serve, train
from kaiyuan_recipes.upstream_warnings import ignore_upstream_warnings

SUBCOMMANDS = (train, lifecycle, cluster, models, data, ckpt, average, export, evaluate, serve, doctor)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kaiyuan", description="Kaiyuan-2B pretraining recipes")
    parser.add_argument("--version", action="version", version=f"kaiyuan-recipes {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def quiet_upstream_noise() -> None:
    """Megatron logs optional-import tracebacks at INFO and warns about absent TE/Apex on every
    import; on a host without them that is expected, so keep the console for our output."""
    logging.basicConfig(level=logging.WARNING)
    for name in ("megatron", "megatron.bridge", "megatron.core", "torch.utils.cpp_extension"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # This module resets its own level to INFO at import and prints optional-import tracebacks.
    logging.getLogger("megatron.bridge.utils.import_utils").disabled = True
    ignore_upstream_warnings()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Overrides may come before or after options (`train gpt_smoke --dry-run a.b=1 c.d=2`).
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra  # one without '=' is refused by name with the others
    quiet_upstream_noise()
    try:
        return int(args.func(args) or 0)
    except (ValueError, KeyError, FileNotFoundError, FileExistsError, RuntimeError) as err:
        # Configuration and input errors (DownloadError, BadInputError; an output directory that already exists):
        # one clear line, no traceback.
        print(f"kaiyuan: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
