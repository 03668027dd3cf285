"""The tested versions are stated once, in kaiyuan_recipes/doctor.py's TESTED_MATRIX; everything else that names them
agrees with it. Each row's lock file (constraints/*.txt) pins exactly the row's versions and a torch inside the row's
range, and every lock belongs to a row; each environment's lock satisfies what pyproject.toml asks of the extras the
Makefile installs into it (so a range that excludes a tested version fails here, not on a user's install); and the
Makefile states no version of its own (`make lock` takes the pins from the matrix)."""

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from kaiyuan_recipes.doctor import TESTED_MATRIX

REPO = Path(__file__).resolve().parents[1]
# The environments the Makefile builds: the lock and the extras of each, as `make` itself expands them.
ENVIRONMENTS = (("LOCK", "EXTRAS"), ("LOCK2", "EXTRAS2"), ("LOCK3", "EXTRAS3"))


def read_lock(path: Path) -> dict[str, Version]:
    pins = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"{path}:{number}: not a name==version pin: {line!r}"
        pins[canonicalize_name(name)] = Version(version.strip())
    return pins


def make_variables(*names: str) -> dict[str, str]:
    out = subprocess.run(["make", "-s", "--no-print-directory", "--eval", "print-%: ; @echo $($*)",
                          *[f"print-{n}" for n in names]], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    values = out.stdout.splitlines()
    assert len(values) == len(names), out.stdout
    return dict(zip(names, values))


@pytest.mark.parametrize("stack", TESTED_MATRIX, ids=lambda s: s.name)
def test_each_lock_pins_its_rows_versions(stack):
    lock = read_lock(REPO / stack.lock)
    for dist, version in stack.pins().items():
        assert dist in lock, f"{stack.lock} has no {dist} (TESTED_MATRIX {stack.name}: {version})"
        assert lock[dist].public == Version(version).public, (
            f"{stack.lock} pins {dist}=={lock[dist]}, TESTED_MATRIX {stack.name} says {version}")
    ranges = [SpecifierSet(r) for r in stack.torch.split(" || ")]
    assert any(r.contains(lock["torch"], prereleases=True) for r in ranges), (
        f"{stack.lock} pins torch=={lock['torch']}, outside TESTED_MATRIX {stack.name}'s {stack.torch_tested}")
    if stack.megatron_bridge is None:
        assert "megatron-bridge" not in lock, f"{stack.lock} has megatron-bridge; its row {stack.name} has none"


def test_every_lock_belongs_to_a_row_of_the_matrix():
    locks = {str(p.relative_to(REPO)) for p in (REPO / "constraints").glob("*.txt")}
    assert locks == {s.lock for s in TESTED_MATRIX}


def test_each_environments_lock_satisfies_pyprojects_requirements():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    variables = make_variables(*[name for pair in ENVIRONMENTS for name in pair])
    assert {variables[lock] for lock, _ in ENVIRONMENTS} == {s.lock for s in TESTED_MATRIX}
    problems = []
    for lock_var, extras_var in ENVIRONMENTS:
        lock_file = variables[lock_var]
        lock = read_lock(REPO / lock_file)
        extras = variables[extras_var].split(",")
        wanted = list(project["dependencies"]) + [r for e in extras for r in project["optional-dependencies"][e]]
        for requirement in map(Requirement, wanted):
            if requirement.marker is not None and not requirement.marker.evaluate():
                continue
            name = canonicalize_name(requirement.name)
            if name not in lock:
                problems.append(f"{lock_file}: no {name} (pyproject asks {requirement}; extras {extras})")
            elif not requirement.specifier.contains(lock[name], prereleases=True):
                problems.append(f"{lock_file}: {name}=={lock[name]} outside pyproject's {requirement}")
    assert problems == []


def test_the_makefile_states_no_framework_version():
    """`make lock` resolves each row from doctor.lock_pins; a version written into the Makefile would be a second
    statement that drifts."""
    makefile = (REPO / "Makefile").read_text()
    assert "lock_pins" in makefile
    stated = []
    for stack in TESTED_MATRIX:
        for dist, version in stack.pins().items():
            if re.search(rf"{re.escape(dist)}\W{{1,2}}{re.escape(version)}\b", makefile):
                stated.append(f"{dist} {version}")
    assert stated == []
