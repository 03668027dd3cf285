"""The core (recipe files, CLI parsing, parameter counts, launch commands, metrics reading) imports
without torch or Megatron, so it works on Python 3.11 hosts and with numpy 1.x."""

import subprocess
import sys

CORE = [
    "kaiyuan_recipes.cli.main",
    "kaiyuan_recipes.recipe_tree",
    "kaiyuan_recipes.models.param_count",
    "kaiyuan_recipes.models.registry",
    "kaiyuan_recipes.launch.torchrun",
    "kaiyuan_recipes.run_layout",
    "kaiyuan_recipes.data.download",
    "kaiyuan_recipes.data.heldout",
]


def test_core_imports_without_torch_or_megatron():
    code = "import sys\n" + "".join(f"import {m}\n" for m in CORE) + (
        "heavy = [m for m in ('torch', 'megatron', 'transformers') if m in sys.modules]\nprint(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
