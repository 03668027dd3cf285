"""Every command in README.md's code blocks works as written on a fresh checkout, checked without a GPU:

- `kaiyuan ...` (also through `k=.venv/bin/kaiyuan`, `$k`): parsed by the real CLI parser, as `kaiyuan` parses it
  (a subcommand or flag that does not exist fails); each override's key must exist (the `kaiyuan.*` knobs, the
  `ConfigContainer` fields); a `--dry-run` line is run.
- `make TARGET [VAR=value]`: `make -n` (the target exists and its recipe expands).
- `bash tests/gpu/SCRIPT.sh ...`: the script's `--help` succeeds and lists every flag the line uses.
- `python -m pytest ...`: collected with `--collect-only`.
A line of any other program fails: add its check here."""

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kaiyuan_recipes.cli.main import build_parser
from kaiyuan_recipes.config.knobs import Knobs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.M | re.S)


def readme_commands(text: str) -> list[list[str]]:
    """Each command line of the bash blocks as an argv: continuations joined, comments dropped, `$k`-style
    variables set in the block substituted; the assignments themselves are not commands."""
    commands = []
    for block in BLOCK.findall(text):
        variables = {}
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if not argv:
                continue
            if len(argv) == 1 and re.fullmatch(r"[A-Za-z_]\w*=\S+", argv[0]):
                name, value = argv[0].split("=", 1)
                variables[name] = value
                continue
            commands.append([re.sub(r"^\$(\w+)$", lambda m: variables.get(m.group(1), m.group(0)), a) for a in argv])
    return commands


def parse_kaiyuan(argv: list[str]):
    """What `kaiyuan` (cli/main.py) does before dispatching: known args, the rest only as overrides."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
    except SystemExit as exit:  # argparse's answer to an unknown subcommand or a bad value
        raise AssertionError(f"kaiyuan {shlex.join(argv)}: the CLI refuses it (exit {exit.code})") from None
    if extra:
        assert hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra), (
            f"kaiyuan {shlex.join(argv)}: unrecognized arguments {extra}")
        args.overrides = list(args.overrides) + extra
    return args


@pytest.fixture(scope="module")
def container_keys():
    from kaiyuan_recipes.config.overrides import dataclass_keys
    from kaiyuan_recipes.training.config import build_config

    cfg, _ = build_config("gpt_smoke", ["kaiyuan.data=mock"])
    return set(dataclass_keys(cfg))


def check_overrides(argv: list[str], overrides: list[str], container_keys: set[str]) -> None:
    knobs = {f.name for f in dataclasses.fields(Knobs)}
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key.startswith("kaiyuan."):
            assert key.removeprefix("kaiyuan.") in knobs, f"kaiyuan {shlex.join(argv)}: no knob {key}"
        else:
            assert key in container_keys, f"kaiyuan {shlex.join(argv)}: no ConfigContainer field {key}"


def check_command(argv: list[str], container_keys: set[str], tmp_path: Path) -> None:
    program = argv[0]
    if program == "kaiyuan" or program.endswith("/kaiyuan"):
        args = parse_kaiyuan(argv[1:])
        check_overrides(argv[1:], list(getattr(args, "overrides", [])), container_keys)
        if "--dry-run" in argv:
            run = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", *argv[1:],
                                  f"kaiyuan.run_root={tmp_path}"], capture_output=True, text=True, timeout=600)
            assert run.returncode == 0, f"{shlex.join(argv)}:\n{run.stderr[-3000:]}"
    elif program == "make":
        run = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"{shlex.join(argv)}: make -n fails:\n{run.stderr[-2000:]}"
    elif program == "bash" and argv[1].startswith("tests/gpu/"):
        run = subprocess.run(["bash", argv[1], "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"{argv[1]} --help fails:\n{run.stderr[-2000:]}"
        for flag in (a for a in argv[2:] if a.startswith("--")):
            listed = re.search(rf"(?m)^\s*{re.escape(flag)}\b", run.stdout)
            assert listed, f"{shlex.join(argv)}: {argv[1]} has no {flag}"
    elif Path(program).name.startswith("python3") and argv[1:3] == ["-m", "venv"]:
        assert len(argv) == 4, f"{shlex.join(argv)}: expected python3.X -m venv DIR"
    elif Path(program).name == "pip" and argv[1] == "install":
        check_pip_install(argv)
    elif argv[:3] == ["python", "-m", "pytest"]:
        run = subprocess.run([sys.executable, "-m", "pytest", *argv[3:], "--collect-only", "-q", "-p",
                              "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and " collected" in run.stdout, f"{shlex.join(argv)}:\n{run.stdout[-2000:]}"
    else:
        raise AssertionError(f"README command {shlex.join(argv)}: no check for {program!r} in {__file__}")


def check_pip_install(argv: list[str]) -> None:
    """`pip install -c LOCK -e ".[extras]"` / `--no-deps PKG`: the lock file exists and pins each named package, each
    extra is one pyproject.toml declares (what the Makefile's bridge_env installs)."""
    import tomllib

    line = shlex.join(argv)
    assert "-c" in argv, f"{line}: install against a constraints file (-c constraints/...)"
    lock = ROOT / argv[argv.index("-c") + 1]
    assert lock.is_file(), f"{line}: no {lock}"
    pinned = {ln.split("==")[0].strip().lower() for ln in lock.read_text().splitlines() if "==" in ln}
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    rest = [a for i, a in enumerate(argv[2:], start=2) if not a.startswith("-") and argv[i - 1] != "-c"]
    for target in rest:
        match = re.fullmatch(r"\.\[([\w,-]+)\]", target)
        if match:
            unknown = set(match.group(1).split(",")) - set(extras)
            assert not unknown, f"{line}: no extra(s) {sorted(unknown)} in pyproject.toml"
        else:
            assert target.lower() in pinned, f"{line}: {target} is not pinned in {lock.name}"


def test_readme_holds_commands_of_each_kind():
    commands = readme_commands(README.read_text())
    programs = {Path(c[0]).name for c in commands}
    assert {"kaiyuan", "make", "bash", "python"} <= programs, programs


def test_every_readme_command_is_valid(container_keys, tmp_path):
    for argv in readme_commands(README.read_text()):
        check_command(argv, container_keys, tmp_path)


@pytest.mark.parametrize("line, message", [
    ("kaiyuan ckpt lss runs/exp1", "the CLI refuses it"),
    ("kaiyuan serve ./hf --portt 5000", "unrecognized arguments"),
    ("kaiyuan train gpt_smoke kaiyuan.chunked_los=false", "no knob kaiyuan.chunked_los"),
    ("kaiyuan train gpt_smoke train.train_iter=5", "no ConfigContainer field train.train_iter"),
    ("make no-such-target", "make -n fails"),
    ("bash tests/gpu/journey.sh --partt foreground", "has no --partt"),
    ("curl http://localhost:5000/v1/models", "no check for 'curl'"),
    ('.venv/bin/pip install -c constraints/bridge.txt -e ".[bridge,sevre]"', "no extra(s) ['sevre']"),
    (".venv/bin/pip install -c constraints/bridge.txt --no-deps megatron-bridgee", "megatron-bridgee is not pinned"),
])
def test_a_wrong_command_fails(line, message, container_keys, tmp_path):
    (argv,) = readme_commands(f"```bash\n{line}\n```\n")
    with pytest.raises(AssertionError, match=re.escape(message)):
        check_command(argv, container_keys, tmp_path)


def test_the_readme_python_quickstart_runs_to_its_dry_run(tmp_path):
    """README's Python block, as written: the package exposes what it shows, and NeMo-Run's dry run of the experiment
    names the training entry point with the recipe and overrides."""
    (code,) = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NEMORUN_HOME": str(tmp_path / "nemo_run"), "COLUMNS": "400",
                               "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    shown = " ".join(done.stdout.split())
    assert "kaiyuan_recipes.training.entry" in shown and "qwen3_1p7b" in shown and "torchrun" in shown, shown[-3000:]
