"""Imported first by the conversion workers' forkserver (data/convert.py preloads it before megatron-core): a fresh
interpreter, so the CLI's warning filters are not there; without this every `kaiyuan data convert` and every
first training start (the bundled sample corpus is converted then) printed megatron-core's import-time warnings."""

from kaiyuan_recipes.upstream_warnings import ignore_upstream_warnings

ignore_upstream_warnings()
