"""The cleaning config: a YAML under recipes/cleaning/ (or any path) read into typed dataclasses and checked before
anything runs. Steps run in a fixed order (STEP_ORDER); each is on or off and takes the parameters of the datatrove
component it configures, checked against that component's signature so a misspelt key is an error, not a default."""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# exact dedup first (cheapest removal, and a removed copy never costs a heuristic), the per-document heuristics
# cheapest first, MinHash last (it reads only what the heuristics kept, as FineWeb does).
STEP_ORDER = ("exact_dedup", "length", "language", "gopher_repetition", "gopher_quality", "c4", "fineweb", "minhash")
HEURISTICS = ("gopher_repetition", "gopher_quality", "c4", "fineweb")  # datatrove filters taking their own kwargs
TEXT_REWRITING = ("c4",)  # C4's line filter rewrites the text it keeps: tokens are counted again after it
JACCARD_POINTS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


class CleanConfigError(ValueError):
    pass


@dataclass
class LengthConfig:
    """Our length / character filter (steps.LengthCharFilter); None disables a bound."""

    enabled: bool = True
    min_chars: int | None = 200
    max_chars: int | None = 1_000_000
    max_non_printable_ratio: float | None = 0.01   # control characters other than whitespace
    max_replacement_char_ratio: float | None = 0.001  # U+FFFD: text decoded with the wrong codec
    min_cjk_ratio: float | None = None               # share of CJK ideographs among non-space characters


@dataclass
class LanguageConfig:
    """datatrove's fastText language filter, from a model file on this host only (nothing is downloaded)."""

    enabled: bool = True
    model_path: str | None = None
    languages: list[str] = field(default_factory=lambda: ["en"])
    threshold: float = 0.65


@dataclass
class MinhashConfig:
    """datatrove's MinHash: `bands` buckets of `rows` hashes over word `ngrams`. A pair of Jaccard similarity s is
    found with probability 1 - (1 - s**rows)**bands (detection_probability)."""

    enabled: bool = True
    ngrams: int = 5
    bands: int = 14
    rows: int = 8
    seed: int = 1
    # datatrove's text normalisation before shingling turns every number into 0: texts differing only in their
    # numbers (templated exercises, tables) are then duplicates. False keeps the digits.
    normalize_digits: bool = True

    def detection_probability(self, jaccard: float) -> float:
        return 1.0 - (1.0 - jaccard ** self.rows) ** self.bands

    @property
    def threshold(self) -> float:
        """The similarity where detection turns from unlikely to likely: (1/bands)**(1/rows)."""
        return (1.0 / self.bands) ** (1.0 / self.rows)


@dataclass
class HeuristicConfig:
    enabled: bool = True
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class CleanConfig:
    language: str = "en"              # datatrove's word tokenizer (spaCy blank models: nothing downloaded)
    count_tokens: bool = True
    tokenizer: str | None = None      # a tokenizer.json; None: the bundled Qwen2 BPE
    exact_dedup: bool = True
    length: LengthConfig = field(default_factory=LengthConfig)
    language_filter: LanguageConfig = field(default_factory=lambda: LanguageConfig(enabled=False))
    heuristics: dict[str, HeuristicConfig] = field(default_factory=dict)
    minhash: MinhashConfig = field(default_factory=MinhashConfig)
    source: str = ""                  # where it was read from

    def enabled_steps(self) -> list[str]:
        on = {"exact_dedup": self.exact_dedup, "length": self.length.enabled,
              "language": self.language_filter.enabled, "minhash": self.minhash.enabled}
        on.update({name: h.enabled for name, h in self.heuristics.items()})
        return [s for s in STEP_ORDER if on.get(s)]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("source")
        return d

    def config_hash(self) -> str:
        """sha256 of the resolved config (defaults filled in): two runs with equal hashes ran the same steps."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def minhash_expectation(self) -> dict[str, Any]:
        m = self.minhash
        return {"ngrams": m.ngrams, "bands": m.bands, "rows": m.rows, "seed": m.seed,
                "normalize_digits": m.normalize_digits,
                "threshold": round(m.threshold, 4),
                "detection_probability": {f"{s:g}": round(m.detection_probability(s), 4) for s in JACCARD_POINTS}}


def heuristic_class(name: str) -> type:
    """The filter a heuristic step runs: datatrove's, or our subclass of it (filters.py) adding OWN_PARAMS."""
    from datatrove.pipeline.filters import FineWebQualityFilter, GopherRepetitionFilter

    from kaiyuan_recipes.data.clean.filters import C4Lines, GopherQuality

    return {"gopher_repetition": GopherRepetitionFilter, "gopher_quality": GopherQuality,
            "c4": C4Lines, "fineweb": FineWebQualityFilter}[name]


def heuristic_params(name: str) -> dict[str, tuple | None]:
    """The parameters a heuristic step takes: the datatrove filter's keyword arguments (any value), and ours with
    their allowed values."""
    cls = heuristic_class(name)
    own: dict[str, tuple] = getattr(cls, "OWN_PARAMS", {})
    datatrove_cls = next(c for c in cls.__mro__ if c.__module__.startswith("datatrove."))
    allowed: dict[str, tuple | None] = {k: None for k in inspect.signature(datatrove_cls.__init__).parameters
                                        if k not in RESERVED_PARAMS}
    return allowed | own


# set by the pipeline, never by the YAML
RESERVED_PARAMS = {"self", "exclusion_writer", "language", "batch_size"}


def _typed(where: str, value: Any, kind: type | tuple, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise CleanConfigError(f"{where}: expected {'/'.join(k.__name__ for k in kinds)}, got {value!r}")
    if not isinstance(value, kinds):
        raise CleanConfigError(f"{where}: expected {'/'.join(k.__name__ for k in kinds)}, got {value!r}")
    return value


def _dataclass_from(where: str, cls: type, raw: Any) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise CleanConfigError(f"{where}: expected a mapping, got {raw!r}")
    defaults = cls()
    known = set(defaults.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise CleanConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    for key, value in raw.items():
        default = getattr(defaults, key)
        if isinstance(default, bool):
            _typed(f"{where}.{key}", value, bool)
        elif isinstance(default, list):
            _typed(f"{where}.{key}", value, list)
        elif isinstance(default, str) or default is None and key.endswith("path"):
            _typed(f"{where}.{key}", value, str, allow_none=True)
        else:  # numbers; None disables a bound
            _typed(f"{where}.{key}", value, (int, float), allow_none=True)
        setattr(defaults, key, value)
    return defaults


def _heuristic_from(where: str, name: str, raw: Any) -> HeuristicConfig:
    if raw is None:
        raw = {}
    if isinstance(raw, bool):
        return HeuristicConfig(enabled=raw)
    if not isinstance(raw, dict):
        raise CleanConfigError(f"{where}: expected a mapping or true/false, got {raw!r}")
    raw = dict(raw)
    enabled = _typed(f"{where}.enabled", raw.pop("enabled", True), bool)
    allowed = heuristic_params(name)
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise CleanConfigError(f"{where}: unknown parameter(s) {unknown} for {heuristic_class(name).__name__}; "
                               f"known: {sorted(allowed)}")
    for key, value in raw.items():
        choices = allowed[key]
        if choices is not None and (value not in choices or type(value) is not type(choices[0])):
            raise CleanConfigError(f"{where}.{key}: expected one of {list(choices)}, got {value!r}")
    return HeuristicConfig(enabled=enabled, params=raw)


def _positive(where: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CleanConfigError(f"{where}: expected a positive integer, got {value!r}")


def config_from_dict(raw: Any, source: str = "<dict>") -> CleanConfig:
    if not isinstance(raw, dict):
        raise CleanConfigError(f"{source}: expected a mapping with 'steps', got {type(raw).__name__}")
    known_top = {"language", "count_tokens", "tokenizer", "steps", "description"}
    unknown = sorted(set(raw) - known_top)
    if unknown:
        raise CleanConfigError(f"{source}: unknown key(s) {unknown}; known: {sorted(known_top)}")
    cfg = CleanConfig(source=source)
    cfg.language = _typed(f"{source}: language", raw.get("language", "en"), str)
    cfg.count_tokens = _typed(f"{source}: count_tokens", raw.get("count_tokens", True), bool)
    cfg.tokenizer = _typed(f"{source}: tokenizer", raw.get("tokenizer"), str, allow_none=True)
    steps = raw.get("steps") or {}
    if not isinstance(steps, dict):
        raise CleanConfigError(f"{source}: 'steps' must be a mapping of step name -> settings")
    unknown = sorted(set(steps) - set(STEP_ORDER))
    if unknown:
        raise CleanConfigError(f"{source}: unknown step(s) {unknown}; steps are {list(STEP_ORDER)}")
    for name in STEP_ORDER:
        where = f"{source}: steps.{name}"
        if name == "exact_dedup":
            value = steps.get(name, False)
            if isinstance(value, dict) or value is None:
                extra = sorted(set(value or {}) - {"enabled"})
                if extra:
                    raise CleanConfigError(f"{where}: unknown key(s) {extra}; known: ['enabled']")
                value = (value or {}).get("enabled", True)
            cfg.exact_dedup = _typed(where, value, bool)
        elif name == "length":
            cfg.length = _dataclass_from(where, LengthConfig, steps.get(name)) if name in steps \
                else LengthConfig(enabled=False)
        elif name == "language":
            cfg.language_filter = _dataclass_from(where, LanguageConfig, steps.get(name)) if name in steps \
                else LanguageConfig(enabled=False)
        elif name == "minhash":
            cfg.minhash = _dataclass_from(where, MinhashConfig, steps.get(name)) if name in steps \
                else MinhashConfig(enabled=False)
            for key in ("ngrams", "bands", "rows"):
                _positive(f"{where}.{key}", getattr(cfg.minhash, key))
            _typed(f"{where}.seed", cfg.minhash.seed, int)
        else:
            cfg.heuristics[name] = _heuristic_from(where, name, steps.get(name)) if name in steps \
                else HeuristicConfig(enabled=False)
    lang = cfg.language_filter
    if lang.enabled and not lang.model_path:
        raise CleanConfigError(
            f"{source}: steps.language needs model_path, a fastText language-ID model file on this host "
            "(datatrove would download one at run time; this step never does)")
    if not cfg.enabled_steps():
        raise CleanConfigError(f"{source}: every step is off; nothing to clean")
    return cfg


def load_config(path: Path | str | None) -> CleanConfig:
    """A YAML path, a name shipped under recipes/cleaning/ (web, edu, chinese, code), or None for `web`."""
    import yaml

    from kaiyuan_recipes.config.recipe_tree import shipped_yaml

    try:
        resolved = shipped_yaml("cleaning", str(path or "web"), "cleaning config")
    except FileNotFoundError as err:
        raise CleanConfigError(str(err)) from None
    if not resolved.is_file():
        raise CleanConfigError(f"{resolved}: cleaning config not found")
    try:
        raw = yaml.safe_load(resolved.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise CleanConfigError(f"{resolved}: not valid YAML ({err})") from None
    return config_from_dict(raw, str(resolved))
