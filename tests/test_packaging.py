"""pyproject lists packages explicitly (recipes/ ships as kaiyuan_recipes.recipe_files):
every sub-package on disk must be listed, and the recipe files must be package data."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(meta["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "kaiyuan_recipes").rglob("__init__.py")
    }
    assert on_disk <= listed, on_disk - listed
    assert meta["tool"]["setuptools"]["package-dir"]["kaiyuan_recipes.recipe_files"] == "recipes"


def test_recipe_yaml_is_package_data():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = meta["tool"]["setuptools"]["package-data"]["kaiyuan_recipes.recipe_files"]
    files = [p.relative_to(ROOT / "recipes") for p in (ROOT / "recipes").rglob("*.yaml")]
    assert files and all(any(f.match(pat) for pat in patterns) for f in files)
