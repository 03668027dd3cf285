"""The core (recipe files, CLI parsing, parameter counts, launch commands, metrics reading) imports
without torch or Megatron, so it works on Python 3.11 hosts and with numpy 1.x."""

import subprocess
import sys

CORE = [
    "kaiyuan_recipes.cli.main",
    "kaiyuan_recipes.config.knobs",
    "kaiyuan_recipes.config.overrides",
    "kaiyuan_recipes.config.recipe_tree",
    "kaiyuan_recipes.config.run_layout",
    "kaiyuan_recipes.models.param_count",
    "kaiyuan_recipes.models.registry",
    "kaiyuan_recipes.launch.torchrun",
    "kaiyuan_recipes.config.run_layout",
    "kaiyuan_recipes.data.download",
    "kaiyuan_recipes.data.heldout",
]


def test_core_imports_without_torch_or_megatron():
    code = "import sys\n" + "".join(f"import {m}\n" for m in CORE) + (
        "heavy = [m for m in ('torch', 'megatron', 'transformers') if m in sys.modules]\nprint(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_config_is_the_ground_floor():
    """kaiyuan_recipes.config imports nothing from the packages built on it."""
    code = ("import sys\nimport kaiyuan_recipes.config.knobs, kaiyuan_recipes.config.overrides, "
            "kaiyuan_recipes.config.recipe_tree, kaiyuan_recipes.config.run_layout\n"
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in [['kaiyuan_recipes', p] for p in "
            "('training', 'models', 'fastpath', 'launch', 'cli')]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
