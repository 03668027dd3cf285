"""`kaiyuan models list`: the registered model providers with their parameter counts."""

from __future__ import annotations

from typing import Any

from kaiyuan_recipes.config.recipe_tree import known_recipes
from kaiyuan_recipes.models.registry import available_models
from kaiyuan_recipes.models.shape import ModelShape


def add_parser(sub: Any) -> None:
    p = sub.add_parser("models", help="model providers")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    msub.add_parser("list", help="list registered providers").set_defaults(func=list_models)


def list_models(_args: Any) -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="kaiyuan models")
    for col in ("name", "parameters", "active/token", "non-embedding", "layers", "hidden", "heads/groups", "experts",
                "vocab"):
        table.add_column(col)
    recipes = set(known_recipes())
    for name in available_models():
        if name not in recipes:
            table.add_row(name, "?", "?", "?", "", "", "", "", "")
            continue
        shape = ModelShape.for_recipe(name)
        count = shape.parameters()
        table.add_row(
            name,
            f"{count.total / 1e9:.3f}B",
            f"{count.active / 1e9:.3f}B",
            f"{count.non_embedding / 1e9:.3f}B",
            str(shape["num_layers"]),
            str(shape["hidden_size"]),
            f"{shape['num_attention_heads']}/{shape.get('num_query_groups') or shape['num_attention_heads']}",
            (f"{shape['num_moe_experts']} top-{shape.get('moe_router_topk', 2)}"
             if shape.get("num_moe_experts") else "-"),
            f"{shape['vocab_size']:,}",
        )
    Console(width=120).print(table)
    return 0
