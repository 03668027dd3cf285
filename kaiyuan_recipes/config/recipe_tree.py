"""Where recipe files live and how they are read: recipes/<name>/{model,hparams,data}.yaml over
recipes/_base/{hparams,data}.yaml. Pure YAML/OmegaConf: importable without the Megatron stack."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

RECIPE_PARTS = ("model", "hparams", "data")
_BASE = "_base"


class UnknownRecipeError(ValueError):
    pass


def recipes_root() -> Path:
    """Installed: the package kaiyuan_recipes.recipe_files (recipes/ shipped as package data).
    Source checkout on PYTHONPATH (e.g. the GPU host): the repo's recipes/ directory."""
    try:
        return Path(str(resources.files("kaiyuan_recipes.recipe_files")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "recipes"


def shipped_yaml(folder: str, name_or_path: str, what: str) -> Path:
    """A YAML path as given, or a file shipped under recipes/<folder>/ by name (curricula, plans).
    Raises FileNotFoundError naming the shipped ones."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        return path
    shipped = recipes_root() / folder / f"{name_or_path}.yaml"
    if not shipped.is_file():
        known = sorted(p.stem for p in (recipes_root() / folder).glob("*.yaml"))
        raise FileNotFoundError(f"unknown {what} {name_or_path!r}; known: {', '.join(known)} (or a YAML path)")
    return shipped


def known_recipes() -> list[str]:
    root = recipes_root()
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "model.yaml").is_file())


def recipe_dir(name: str) -> Path:
    path = recipes_root() / name
    if not (path / "model.yaml").is_file():
        raise UnknownRecipeError(f"unknown recipe {name!r}; known recipes: {', '.join(known_recipes())}")
    return path


def _load(path: Path) -> DictConfig:
    if not path.is_file():
        return OmegaConf.create({})
    try:
        loaded = OmegaConf.load(path)
    except Exception as err:  # yaml.YAMLError and OmegaConf's own errors
        raise ValueError(f"{path}: not valid YAML: {err}") from err
    if loaded is None:
        return OmegaConf.create({})
    if not isinstance(loaded, DictConfig):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(loaded).__name__}")
    return loaded


def load_model_file(name: str) -> dict:
    return OmegaConf.to_container(_load(recipe_dir(name) / "model.yaml"), resolve=True)  # type: ignore[return-value]


def load_recipe_tree(name: str) -> DictConfig:
    """The merged recipe: {'model': …, <ConfigContainer sections>…, 'kaiyuan': our own knobs}."""
    root = recipe_dir(name)
    merged = OmegaConf.create({"model": _load(root / "model.yaml")})
    for part in ("hparams", "data"):
        merged = OmegaConf.merge(merged, _load(recipes_root() / _BASE / f"{part}.yaml"), _load(root / f"{part}.yaml"))
    return merged
