"""Provider discovery through the `kaiyuan_recipes.models` entry-point group, so other packages
can add models and other tools can find ours."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Callable

ENTRY_POINT_GROUP = "kaiyuan_recipes.models"


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_models() -> list[str]:
    return sorted(_entry_points())


def get_model_provider(name: str) -> Callable[..., Any]:
    eps = _entry_points()
    if name not in eps:
        raise KeyError(f"unknown model {name!r}; registered models: {', '.join(sorted(eps)) or 'none'}")
    return eps[name].load()
