"""The ground floor of kaiyuan_recipes' configuration: the `kaiyuan.*` knobs, command-line overrides, the recipe
tree read from YAML, and the run directory's layout. It imports nothing from training/, models/, fastpath/,
launch/ or cli/ (those build on it)."""
