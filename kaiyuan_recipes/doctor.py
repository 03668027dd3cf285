"""`kaiyuan doctor`: detect this host's stack and judge it. What is installed (versions from importlib.metadata,
never by importing a package for its version), whether that stack is one we tested (TESTED_MATRIX, the one place the
matrix is stated), which compat workarounds apply here, what `auto` picks here and why (a dry build of a recipe, no
training), and what each optional feature still lacks. cli/doctor.py prints the Report; nothing here prints."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class MatrixStack:
    """One stack the suite ran on: exact versions (a local label such as +cu130 is ignored), a torch range whose
    ends were tested, and the lock file that reproduces it. A package left None is not part of the stack."""
    name: str
    lock: str
    megatron_core: str
    transformers: str
    torch: str  # a PEP 440 specifier set, or several joined by " || " (any of them: the versions actually run)
    megatron_bridge: str | None = None
    nemo_toolkit: str | None = None
    nvidia_modelopt: str | None = None  # megatron-bridge imports it; pinned where a stack differs in it
    make_target: str = "env"  # the Makefile target that builds this stack's environment from `lock`

    def pins(self) -> dict[str, str]:
        named = (("megatron-bridge", self.megatron_bridge), ("nemo-toolkit", self.nemo_toolkit),
                 ("megatron-core", self.megatron_core), ("transformers", self.transformers),
                 ("nvidia-modelopt", self.nvidia_modelopt))
        return {dist: version for dist, version in named if version}

    @property
    def torch_tested(self) -> str:
        """The torch range as people read it."""
        return self.torch.replace(" || ", " or ")

    def describe(self) -> str:
        pins = ", ".join(f"{d} {v}" for d, v in self.pins().items())
        return f"{self.name}: {pins}, torch {self.torch_tested} ({self.lock})"


# The tested version matrix. bridge-pypi: `make env` on the CPU host (torch 2.14.1) and the H200 (torch 2.11.0+cu130);
# fw2606-pypi: NeMo Framework 26.06's Megatron side as PyPI has it, `make env-fw2606` (CPU, torch 2.14.1) and the
# H200's journey (tests/gpu/journey.sh --stack fw2606, torch 2.11.0+cu130; the container has torch 2.12.0a0, TE
# 2.16); nemo2: `make env-nemo2` (CPU, torch 2.14.1). A stack that passes the suite elsewhere gets a row here;
# `make lock` resolves each row's environment from its pins (lock_pins).
TESTED_MATRIX: tuple[MatrixStack, ...] = (
    MatrixStack("bridge-pypi", "constraints/bridge.txt", megatron_bridge="0.6.2", megatron_core="0.19.2",
                transformers="5.12.1", torch=">=2.11,<2.15", nvidia_modelopt="0.47.0"),
    MatrixStack("fw2606-pypi", "constraints/fw2606.txt", megatron_bridge="0.5.0", megatron_core="0.18.0",
                transformers="5.8.1", torch="==2.11.* || ==2.14.*", nvidia_modelopt="0.44.0", make_target="env-fw2606"),
    MatrixStack("nemo2", "constraints/nemo2.txt", nemo_toolkit="2.7.3", megatron_core="0.15.3",
                transformers="4.57.6", torch=">=2.14,<2.15", make_target="env-nemo2"),
)


def lock_pins(name: str) -> str:
    """The requirements `make lock` resolves stack `name` with, megatron-bridge last (installed with --no-deps)."""
    stacks = {s.name: s for s in TESTED_MATRIX}
    if name not in stacks:
        raise SystemExit(f"no stack {name!r} in TESTED_MATRIX; known: {sorted(stacks)}")
    pins = stacks[name].pins()
    bridge = pins.pop("megatron-bridge", None)
    return " ".join([f"{d}=={v}" for d, v in pins.items()] + ([f"megatron-bridge=={bridge}"] if bridge else []))

# The detected stack: distribution names as pip knows them.
DISTRIBUTIONS = ("torch", "transformer-engine", "apex", "megatron-core", "megatron-bridge", "transformers",
                 "nvidia-modelopt",
                 "nemo-toolkit", "nemo-run", "triton", "fastapi", "uvicorn")
NEMO2_ONLY = {"cpu_cuda_arch_list"}  # workarounds the NeMo 2 environment applies (its .pth); the rest are Bridge's
INSTALL_BRIDGE = ("`make env` (the tested stack in .venv, from constraints/bridge.txt), or in a container that "
                  "already has it the README's install commands")
INSTALL_NEMO2 = "NeMo 2 lives in its own environment: `make env-nemo2` creates .venv-nemo2 (docs/nemo2.md)"


@dataclass
class Verdict:
    kind: str | None  # "megatron-bridge", "nemo2", or None (neither stack installed)
    tested: bool
    stack: str | None  # the matrix entry this host matches, or the closest one
    mismatches: list[str]
    message: str


@dataclass
class CompatItem:
    function: str
    upstream: str
    versions: str
    defect: str
    applies: bool | None  # None: not part of this environment, or not checkable here
    detail: str


@dataclass
class AutoPlan:
    recipe: str
    layer_spec: str | None
    layer_spec_reason: str
    fastpath: dict[str, str]  # piece -> "on (reason)" / "off (reason)", FastPathPlan.summary()
    sdpa_backend: str | None
    error: str | None = None


@dataclass
class Feature:
    name: str
    ready: bool
    missing: list[str]
    how: str


@dataclass
class Report:
    python: str
    executable: str
    packages: dict[str, str | None]
    torch_cuda: str | None
    transformer_engine_importable: bool
    apex_importable: bool
    gpus: list[str]
    verdict: Verdict
    tested_matrix: list[MatrixStack]
    compat: list[CompatItem]
    auto: AutoPlan | None
    features: list[Feature]
    exit_code: int


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_versions() -> dict[str, str | None]:
    return {dist: _version(dist) for dist in DISTRIBUTIONS}


def _matches(have: str | None, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet  # (here: the base install, no Megatron, may lack packaging)
    from packaging.version import InvalidVersion, Version

    try:
        return have is not None and any(SpecifierSet(one).contains(Version(have), prereleases=True)
                                        for one in spec.split("||"))
    except InvalidVersion:
        return False


def mismatches(stack: MatrixStack, versions: dict[str, str | None]) -> list[str]:
    """What differs from `stack`: one "package installed (tested: version)" per difference."""
    wanted = {**{d: (f"=={v}", v) for d, v in stack.pins().items()}, "torch": (stack.torch, stack.torch_tested)}
    return [f"{dist} {versions.get(dist) or 'not installed'} (tested: {shown})"
            for dist, (spec, shown) in wanted.items() if not _matches(versions.get(dist), spec)]


def judge(versions: dict[str, str | None], matrix: tuple[MatrixStack, ...] = TESTED_MATRIX) -> Verdict:
    """Is this stack in `matrix`? Bridge when megatron-bridge is installed, else NeMo 2 when nemo-toolkit is."""
    tested = "Tested: " + "; ".join(s.describe() for s in matrix) + "."
    if versions.get("megatron-bridge") and versions.get("megatron-core"):
        kind, candidates = "megatron-bridge", [s for s in matrix if s.megatron_bridge]
    elif versions.get("nemo-toolkit") and versions.get("megatron-core"):
        kind, candidates = "nemo2", [s for s in matrix if s.nemo_toolkit]
    else:
        absent = [d for d in ("megatron-bridge", "megatron-core") if not versions.get(d)]
        return Verdict(None, False, None, [f"{d} not installed" for d in absent],
                       f"{' and '.join(absent)} not installed: the training stack is missing. Install it with "
                       f"{INSTALL_BRIDGE}. {INSTALL_NEMO2}. {tested}")
    if not candidates:
        return Verdict(kind, False, None, [], f"no {kind} stack in the tested matrix. {tested}")
    ranked = sorted(candidates, key=lambda s: len(mismatches(s, versions)))
    best, diff = ranked[0], mismatches(ranked[0], versions)
    if not diff:
        where = ("" if kind == "megatron-bridge" else ": `nemo llm pretrain --factory kaiyuan_qwen3` runs here; "
                 "`kaiyuan train` / export need megatron-bridge, the Bridge environment (`make env`, .venv)")
        return Verdict(kind, True, best.name, [], f"in the tested matrix: {best.name} ({best.lock}){where}")
    return Verdict(kind, False, best.name, diff,
                   f"untested {kind} stack: {'; '.join(diff)}. It may work, but nothing here shows it does. "
                   f"`make {best.make_target}` reproduces {best.name} from "
                   f"{best.lock}. {tested}")


def _gpus() -> tuple[str | None, list[str]]:
    if importlib.util.find_spec("torch") is None:
        return None, []
    import torch  # for the GPUs themselves (torch.cuda), not for a version

    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        props = [torch.cuda.get_device_properties(i) for i in range(count)]
        names = [f"{p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB)" for p in props]
    except RuntimeError:  # a driver that torch cannot talk to
        names = []
    return torch.version.cuda, names


def _call_workaround(function: Any) -> tuple[bool | None, str]:
    if any(p.default is inspect.Parameter.empty for p in inspect.signature(function).parameters.values()):
        return None, "applied per run, from its config"
    try:
        applied = bool(function())
        return applied, "applied: its condition holds here" if applied else "not needed here"
    except Exception as err:  # an untested stack may lack what the workaround patches
        return None, f"could not check: {type(err).__name__}: {err}"


def compat_items(kind: str | None) -> list[CompatItem]:
    """Each WORKAROUNDS row: does it apply here? Zero-argument workarounds say so themselves (they return whether
    they applied); the two that act on a run's config are judged from the dry build (fill_auto)."""
    from kaiyuan_recipes import compat

    items = []
    for row in compat.WORKAROUNDS:
        item = CompatItem(row.function, row.upstream, row.versions, row.defect, None, "")
        nemo2_row = row.function in NEMO2_ONLY
        if kind is None:
            item.detail = "no megatron-bridge / NeMo 2 stack installed"
        elif (kind == "nemo2") != nemo2_row:
            item.detail = "NeMo 2 environment only" if nemo2_row else "Bridge environment only"
        elif row.function == "cpu_cuda_arch_list":  # ran at interpreter start (.pth): ask it again, unset
            saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
            if saved == "9.0":
                del os.environ["TORCH_CUDA_ARCH_LIST"]
            item.applies, item.detail = _call_workaround(compat.cpu_cuda_arch_list)
            if item.applies:
                item.detail = "no NVIDIA driver: set at interpreter start (kaiyuan_compat.pth, `make env-nemo2`)"
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            if saved is not None:
                os.environ["TORCH_CUDA_ARCH_LIST"] = saved
        elif hasattr(compat, row.function):
            item.applies, item.detail = _call_workaround(getattr(compat, row.function))
            if row.function == "install_lora_placeholder" and not compat.transformer_engine_available():
                item.applies, item.detail = True, "no Transformer Engine"  # (returns False once installed)
        else:
            item.detail = "not in kaiyuan_recipes.compat"
        items.append(item)
    return items


def layer_spec_reason(layer_spec: str, deterministic: bool) -> str:
    """Why resolve_layer_spec (models/providers.py) picked `layer_spec` for `auto`."""
    return "auto: " + {
        "transformer_engine": "Transformer Engine is installed",
        "fast": "no Transformer Engine, a CUDA GPU: the fast spec (SDPA, TE-free fusions; docs/fastpath.md)",
    }.get(layer_spec, "kaiyuan.deterministic=true (the fast spec's SDPA backward is not deterministic)" if deterministic
          else "no Transformer Engine and no CUDA GPU: Megatron's local spec")


def fill_auto(report: Report, recipe: str) -> None:
    """The dry build (no training) that `kaiyuan train <recipe>` does: the layer spec and fast-path plan that
    `auto` resolves on this host, and the config-dependent compat rows."""
    try:
        from kaiyuan_recipes.training.config import build_config

        _cfg, run = build_config(recipe, ["kaiyuan.data=mock"])
    except Exception as err:
        report.auto = AutoPlan(recipe, None, "", {}, None, f"{type(err).__name__}: {err}")
        return
    report.auto = AutoPlan(recipe, run.layer_spec, layer_spec_reason(run.layer_spec, run.deterministic),
                           run.fastpath.summary(), run.fastpath.sdpa_backend)
    graph = report.auto.fastpath["cuda_graph"]
    from_run = {"apply_local_spec_settings": (run.layer_spec != "transformer_engine", f"layer_spec={run.layer_spec}"),
                "separate_full_graph_pools": (run.fastpath.on("cuda_graph"), f"cuda_graph {graph}"),
                "wgrad_fusion_without_apex": (run.wgrad_fusion_without_apex is not None,
                                              run.wgrad_fusion_without_apex or "gradient_accumulation_fusion "
                                              "off, or Apex's extension (or the fast path's stand-in) present")}
    for item in report.compat:
        if item.function in from_run and item.applies is None and item.detail.startswith("applied per run"):
            item.applies, item.detail = from_run[item.function]


def features(versions: dict[str, str | None], gpus: list[str]) -> list[Feature]:
    def missing(*dists: str) -> list[str]:
        return [d for d in dists if not versions.get(d)]

    # Megatron's training asserts a CUDA device at initialisation: say so here, not 20 s into a launch
    train = missing("megatron-bridge", "megatron-core", "torch") + ([] if gpus else ["a CUDA GPU visible to torch"])

    serve = missing("fastapi", "uvicorn", "transformers", "torch")
    nemo = missing("nemo-toolkit") + ([] if importlib.util.find_spec("nemo") else ["nemo (not importable)"])
    multi = {"ssh client on PATH": "apt-get install openssh-client", "nemo-run": "pip install 'kaiyuan-recipes[run]'"}
    multi = {k: v for k, v in multi.items() if not (shutil.which("ssh") if k.startswith("ssh") else
                                                     importlib.util.find_spec("nemo_run"))}
    bridge_note = "" if versions.get("megatron-bridge") else "; a Megatron checkpoint needs megatron-bridge: `make env`"
    return [
        Feature("training", not train, train,
                "kaiyuan start <recipe> <name>" if not train else
                "`make env` on a host with an NVIDIA GPU; without one, data, export, serve and eval still work"),
        Feature("serving", not serve, sorted(set(serve)),
                ("pip install 'kaiyuan-recipes[serve]'" if serve else "kaiyuan serve <hf-dir | run>") + bridge_note),
        Feature("nemo2", not nemo, nemo, "nemo llm pretrain --factory kaiyuan_qwen3" if not nemo else INSTALL_NEMO2),
        Feature("multi-node", not multi, list(multi),
                "; ".join(multi.values()) or "kaiyuan start <recipe> <name> --hosts ... (docs/multinode.md)"),
    ]


def diagnose(matrix: tuple[MatrixStack, ...] = TESTED_MATRIX, recipe: str = "gpt_smoke",
             dry_build: bool = True, progress: Callable[[str], None] = lambda step: None) -> Report:
    """The whole report; exit_code 0 only on a stack in `matrix`. `progress` is told each check as it starts (the
    last ones import torch and Megatron-Bridge: seconds to a minute)."""
    progress("installed versions")
    versions = installed_versions()
    verdict = judge(versions, matrix)
    progress("torch and the GPUs (imports torch)")
    torch_cuda, gpus = _gpus()
    progress("Transformer Engine, Apex and the upstream workarounds")
    from kaiyuan_recipes.compat import transformer_engine_available

    report = Report(f"{platform.python_implementation()} {platform.python_version()}", sys.executable, versions,
                    torch_cuda, transformer_engine_available(), importlib.util.find_spec("apex") is not None, gpus,
                    verdict, list(matrix), compat_items(verdict.kind), None, features(versions, gpus),
                    0 if verdict.tested else 1)
    if dry_build and verdict.kind == "megatron-bridge":
        progress(f"the `auto` plan of {recipe} (a dry build: imports Megatron-Bridge)")
        fill_auto(report, recipe)
    return report
