"""Blends for Megatron: a training phase (sources with weights, a token budget) or a category plan
(target shares over categories of sources, a total budget, top-up rules) resolved against the
converter's manifests into per-source tokens, epochs and final weights, then into
GPTDatasetConfig.blend / blend_per_split with the held-out set as the validation split."""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from kaiyuan_recipes.data.convert import MANIFEST


class BlendError(ValueError):
    pass


@dataclass
class Source:
    """Indexed-dataset prefixes from one converter output directory (a glob over prefixes)."""

    name: str
    prefixes: list[str]
    tokens: list[int]
    cleaning: dict[str, Any] | None = None  # the converter manifest's record of `kaiyuan data clean`, if any

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens)


def load_source(name: str, output_dir: str, pattern: str = "*") -> Source:
    """All shards in a converter output directory whose prefix matches `pattern`, with token counts
    from its manifest.json."""
    manifest_path = Path(output_dir).expanduser() / MANIFEST
    if not manifest_path.is_file():
        raise BlendError(f"source {name!r}: {manifest_path} not found (run `kaiyuan data convert` first)")
    converted = json.loads(manifest_path.read_text(encoding="utf-8"))
    shards = converted["shards"]
    names = sorted(n for n in shards if fnmatch.fnmatch(n, pattern))
    if not names:
        raise BlendError(f"source {name!r}: no shards matching {pattern!r} in {manifest_path}")
    missing = [f"{n}{ext}" for n in names for ext in (".bin", ".idx")
               if not (manifest_path.parent / f"{n}{ext}").is_file()]
    if missing:
        raise BlendError(f"source {name!r}: {manifest_path} lists shards whose files are gone "
                         f"({', '.join(missing[:3])}); rerun `kaiyuan data convert` for that directory")
    return Source(name, [str(manifest_path.parent / n) for n in names], [int(shards[n]["tokens"]) for n in names],
                  converted.get("cleaning"))


@dataclass
class CategoryResult:
    name: str
    share: float
    available_tokens: int
    planned_tokens: float
    epochs: float
    topped_up_from: dict[str, float] = field(default_factory=dict)


def plan_categories(plan: dict[str, Any], sources: dict[str, list[Source]]) -> dict[str, Any]:
    """Resolve a category plan: each category gets share × total tokens, drawn from its sources in
    proportion to their sizes; a short category with `top_up_from` moves its shortfall to that
    category; repetition (epochs) above `max_epochs` is an impossible budget."""
    total = float(plan["total_tokens"])
    max_epochs = float(plan.get("max_epochs", 4.0))
    cats = plan["categories"]
    shares = {name: float(c["share"]) for name, c in cats.items()}
    if abs(sum(shares.values()) - 1.0) > 1e-6:
        raise BlendError(f"plan: category shares sum to {sum(shares.values()):.4f}, expected 1.0")
    available = {name: sum(s.total_tokens for s in sources[name]) for name in cats}
    for name, tokens in available.items():
        if tokens == 0:
            raise BlendError(f"category {name!r}: no tokens in its sources {[s.name for s in sources[name]]}")
    need = {name: shares[name] * total for name in cats}
    topped: dict[str, dict[str, float]] = {name: {} for name in cats}
    for name, c in cats.items():
        donor = c.get("top_up_from")
        cap = available[name] * max_epochs
        if donor and need[name] > available[name]:
            # Take this category once through; the rest comes from the donor.
            shortfall = need[name] - available[name]
            if donor not in cats:
                raise BlendError(f"category {name!r}: top_up_from {donor!r} is not a category of the plan")
            need[name] -= shortfall
            need[donor] += shortfall
            topped[donor][name] = shortfall
        elif need[name] > cap:
            raise BlendError(
                f"category {name!r}: needs {need[name]:.3g} tokens but has {available[name]:.3g} "
                f"(> max_epochs={max_epochs:g} repetitions); lower its share or the total, or add data"
            )
    results, weights, prefixes, per_source = [], [], [], []
    for name in cats:
        if need[name] > available[name] * max_epochs:
            raise BlendError(f"category {name!r}: after top-ups needs {need[name]:.3g} tokens, "
                             f"has {available[name]:.3g}")
        epochs = need[name] / available[name]
        results.append(CategoryResult(name, shares[name], available[name], need[name], epochs, topped[name]))
        for src in sources[name]:
            for prefix, tokens in zip(src.prefixes, src.tokens):
                share_of_cat = tokens / available[name]
                prefixes.append(prefix)
                weights.append(need[name] * share_of_cat / total)
            per_source.append({"category": name, "source": src.name, "tokens": src.total_tokens,
                               "planned_tokens": need[name] * src.total_tokens / available[name], "epochs": epochs,
                               **({"cleaning": src.cleaning} if src.cleaning else {})})
    return {
        "total_tokens": total,
        "seed": int(plan.get("seed", 42)),
        "categories": [r.__dict__ for r in results],
        "sources": per_source,
        "blend": {"prefixes": prefixes, "weights": weights},
    }


def plan_path(name_or_path: str) -> Path:
    """A plan shipped under recipes/plans/ by name, or a YAML path."""
    from kaiyuan_recipes.config.recipe_tree import shipped_yaml

    try:
        return shipped_yaml("plans", name_or_path, "plan")
    except FileNotFoundError as err:
        raise BlendError(str(err)) from None


# What a plan's category and source entries may hold: a misspelt key (`wieght`, `top_upfrom`) would otherwise be
# ignored and the plan resolved without it. The top level is left open: it may hold variables for interpolation.
CATEGORY_KEYS = ("share", "sources", "top_up_from")
SOURCE_KEYS = ("name", "dir", "pattern")


def _refuse_unknown_keys(where: str, entry: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(entry) - set(known))
    if unknown:
        raise BlendError(f"{where}: unknown key(s) {unknown}; expected {', '.join(known)}")


def load_plan(path: Path) -> tuple[dict[str, Any], dict[str, list[Source]]]:
    path = Path(path)
    try:
        plan = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as err:
        raise BlendError(f"{path}: not a readable plan ({err})") from err
    if not isinstance(plan, dict):
        raise BlendError(f"{path}: expected a mapping with 'total_tokens' and 'categories'")
    for key in ("total_tokens", "categories"):
        if key not in plan:
            raise BlendError(f"{path}: missing {key!r}")
    total = plan["total_tokens"]
    if not positive_number(total) or isinstance(total, str):
        raise BlendError(f"{path}: total_tokens must be a positive number, got {total!r}")
    if not isinstance(plan["categories"], dict) or not plan["categories"]:
        raise BlendError(f"{path}: 'categories' must be a mapping of category name -> {{share, sources}}")
    max_epochs = plan.get("max_epochs", 4.0)
    if not positive_number(max_epochs) or isinstance(max_epochs, str):
        raise BlendError(f"{path}: max_epochs must be a positive number, got {max_epochs!r}")
    sources = {}
    for name, cat in plan["categories"].items():
        where = f"{path}: category {name!r}"
        if not isinstance(cat, dict) or "share" not in cat or not cat.get("sources"):
            raise BlendError(f"{where} needs 'share' and 'sources'")
        _refuse_unknown_keys(where, cat, CATEGORY_KEYS)
        if cat.get("top_up_from") is not None and cat["top_up_from"] not in plan["categories"]:
            raise BlendError(f"{where}: top_up_from {cat['top_up_from']!r} is not a category of the plan")
        share = cat["share"]
        if not positive_number(share) or isinstance(share, str) or share > 1:
            raise BlendError(f"{where}: share must be a number in (0, 1], got {share!r}")
        if not isinstance(cat["sources"], list):
            raise BlendError(f"{where}: 'sources' must be a list of {{name, dir[, pattern]}}")
        sources[name] = []
        for i, src in enumerate(cat["sources"]):
            if not isinstance(src, dict) or not all(isinstance(src.get(k), str) and src[k] for k in ("name", "dir")):
                raise BlendError(f"{where}: sources[{i}] must be a mapping with 'name' and 'dir' (strings), "
                                 f"got {src!r}")
            _refuse_unknown_keys(f"{where}: sources[{i}]", src, SOURCE_KEYS)
            sources[name].append(load_source(src["name"], src["dir"], src.get("pattern", "*")))
    return plan, sources


def to_megatron_blend(blend: dict[str, Any], heldout_prefix: str | None = None) -> dict[str, Any]:
    """GPTDatasetConfig fields: `blend` when validation is split from the data, else
    `blend_per_split` with the held-out prefix as the validation split (and no test split)."""
    train = (list(blend["prefixes"]), [float(w) for w in blend["weights"]])
    if heldout_prefix is None:
        return {"blend": train, "blend_per_split": None}
    return {"blend": None, "blend_per_split": [train, ([heldout_prefix], None), None], "split": None}


def positive_number(value: Any) -> bool:
    """A finite, positive number, or a string that parses as one ('5e11'); YAML's .nan / .inf and booleans are
    not."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return False
    try:
        number = float(value)
    except ValueError:
        return False
    return math.isfinite(number) and number > 0


def check_curriculum(cur: dict[str, Any], path: Path) -> None:
    """Every phase's token budget and source weights, before any data is read: a weight is a positive finite
    ratio or 'tokens' (NaN or an infinity would make every normalised weight NaN; zero or negative, a source
    never read)."""
    if not isinstance(cur.get("phases"), dict):
        raise BlendError(f"{path}: 'phases' must be a mapping of phase number -> {{tokens, sources}}")
    for number, phase in cur["phases"].items():
        where = f"{path}: phase {number}"
        if not isinstance(phase, dict):
            raise BlendError(f"{where}: expected a mapping with 'tokens' and 'sources', got {phase!r}")
        if not positive_number(phase.get("tokens")):
            raise BlendError(f"{where}: tokens {phase.get('tokens')!r} is not a positive finite number")
        sources = phase.get("sources") or []
        if not isinstance(sources, list):
            raise BlendError(f"{where}: 'sources' must be a list of {{name, dir[, weight, pattern]}}")
        for i, spec in enumerate(sources):
            if not isinstance(spec, dict) or not all(isinstance(spec.get(k), str) and spec[k] for k in ("name", "dir")):
                raise BlendError(f"{where}: sources[{i}] must be a mapping with 'name' and 'dir' (strings), "
                                 f"got {spec!r}")
            weight = spec.get("weight", "tokens")
            if weight != "tokens" and not positive_number(weight):
                raise BlendError(f"{where}: sources[{i}] ({spec['name']}): weight {weight!r} is not a positive finite "
                                 "number or 'tokens'")


def load_curriculum(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        cur = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as err:
        raise BlendError(f"{path}: not a readable curriculum ({err})") from err
    if not isinstance(cur, dict) or not cur.get("phases"):
        raise BlendError(f"{path}: no 'phases'")
    check_curriculum(cur, path)
    return cur


def phase_iterations(cur: dict[str, Any], tokens_per_step: int | None = None) -> dict[int, tuple[int, int]]:
    """Phase number → (first iteration, last iteration), from each phase's token budget at the
    training run's tokens per step (default: the curriculum's global batch × sequence length).
    Iterations count on across phases: phase k resumes phase k-1's checkpoint, so the LR schedule
    and consumed samples stay continuous."""
    tokens_per_step = tokens_per_step or int(cur["global_batch_size"]) * int(cur["seq_length"])
    bounds, start = {}, 0
    for number in sorted(int(k) for k in cur["phases"]):
        steps = round(float(cur["phases"][number]["tokens"]) / tokens_per_step)
        if steps < 1:
            raise BlendError(f"phase {number}: token budget below one step ({tokens_per_step} tokens)")
        bounds[number] = (start + 1, start + steps)
        start += steps
    return bounds


PHASE_ORDERS = ("shuffled", "as_stored", "by_rank")  # data/ordered_dataset.py reads the last two


def phase_order(cur: dict[str, Any], number: int) -> str:
    """How phase `number` visits its documents: Megatron's shuffle, or each source in stored / rank order."""
    phases = {int(k): v for k, v in cur["phases"].items()}
    order = (phases.get(number) or {}).get("order", "shuffled")
    if order not in PHASE_ORDERS:
        raise BlendError(f"phase {number}: order {order!r}; expected one of {', '.join(PHASE_ORDERS)}")
    return order


def phase_blend(cur: dict[str, Any], number: int) -> dict[str, Any]:
    """Prefixes and weights of one phase. A source's `weight` is a ratio, or `tokens` to weight it by
    its converted size (from the converter's manifest); inside a source, shards weigh by tokens. An ordered
    phase blends whole sources (their directories: OrderedGPTDataset reads a source's shards in file order)."""
    phases = {int(k): v for k, v in cur["phases"].items()}
    if number not in phases:
        raise BlendError(f"phase {number}: not in the curriculum (phases {sorted(phases)})")
    specs = phases[number].get("sources") or []
    if not specs:
        raise BlendError(f"phase {number}: no sources")
    ordered = phase_order(cur, number) != "shuffled"
    if ordered and any(s.get("pattern", "*") != "*" for s in specs):
        raise BlendError(f"phase {number}: an ordered phase reads every shard of a source; drop 'pattern' from "
                         f"{[s['name'] for s in specs if s.get('pattern', '*') != '*']}")
    sources = [load_source(s["name"], s["dir"], s.get("pattern", "*")) for s in specs]
    raw = [float(src.total_tokens) if spec.get("weight", "tokens") == "tokens" else float(spec["weight"])
           for spec, src in zip(specs, sources)]
    for spec, w in zip(specs, raw):  # check_curriculum checked the ratios; a source's tokens may still be 0
        if not (math.isfinite(w) and w > 0):
            raise BlendError(f"phase {number}: source {spec['name']!r}: weight {w!r} is not a positive finite number")
    largest = max(raw)
    raw = [w / largest for w in raw]  # so that the sum of weights near the float maximum does not overflow
    if ordered:
        prefixes = [str(Path(spec["dir"]).expanduser()) for spec in specs]
        return {"prefixes": prefixes, "weights": [w / sum(raw) for w in raw], "tokens": float(phases[number]["tokens"])}
    prefixes, weights = [], []
    for w, src in zip(raw, sources):
        for prefix, tokens in zip(src.prefixes, src.tokens):
            prefixes.append(prefix)
            weights.append(w / sum(raw) * tokens / src.total_tokens)
    return {"prefixes": prefixes, "weights": weights, "tokens": float(phases[number]["tokens"])}
