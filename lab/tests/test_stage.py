"""lab/stage.py, the real script in subprocesses on real files: pack here, then one `receive` per simulated
device call (a folder holding only what that call carries), against a temporary --root standing for the GPU host's
/tmp/stage."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAGE = REPO / "lab" / "stage.py"
BUDGET = 1_000_000  # bytes one call carries of the payload: the manifest and one part


def stage(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STAGE), *map(str, args)], cwd=cwd, capture_output=True, text=True)


@pytest.fixture
def payload(tmp_path):
    """Random bytes: a file of 4.2 parts, a folder of small files (one nested, one empty), packed as `t`."""
    rng = __import__("random").Random(34)
    src = tmp_path / "src"
    (src / "dir" / "sub").mkdir(parents=True)
    files = {"big.bin": 4_200_000, "dir/a.whl": 1_234, "dir/b.tar.gz": 456_789, "dir/sub/c": 10, "dir/empty": 0}
    for name, size in files.items():
        (src / name).write_bytes(rng.randbytes(size))
    host = tmp_path / "host"
    host.mkdir()
    r = stage("pack", "t", src / "big.bin", src / "dir", "--part-bytes", BUDGET, cwd=host)
    assert r.returncode == 0, r.stderr
    return {"src": src, "host": host, "root": tmp_path / "gpu-tmp-stage", "tmp": tmp_path, "pack_out": r.stdout,
            "names": {"big.bin": "big.bin", "dir/a.whl": "a.whl", "dir/b.tar.gz": "b.tar.gz", "dir/sub/c": "sub/c",
                      "dir/empty": "empty"}}


def manifest(p) -> dict:
    return json.loads((p["host"] / ".stage" / "t" / "manifest.json").read_text())


def call(p, *parts, manifest_too=True) -> subprocess.CompletedProcess:
    """One device call: a fresh working copy that carries the manifest and the given parts, then `receive`."""
    work = p["tmp"] / "call"
    shutil.rmtree(work, ignore_errors=True)
    (work / ".stage" / "t").mkdir(parents=True)
    carried = (["manifest.json"] if manifest_too else []) + list(parts)
    for name in carried:
        shutil.copy(p["host"] / ".stage" / "t" / name, work / ".stage" / "t" / name)
    return stage("receive", "t", "--root", p["root"], cwd=work)


def status(p) -> dict:
    return json.loads(stage("status", "t", "--root", p["root"], cwd=p["tmp"]).stdout)


def test_pack_fits_each_call_and_prints_its_carry(payload):
    m = manifest(payload)
    names = [part["name"] for part in m["parts"]]
    assert names == ["part-00", "part-01", "part-02", "part-03", "part-04"]
    size = len((payload["host"] / ".stage" / "t" / "manifest.json").read_bytes())
    for part in m["parts"]:
        on_disk = (payload["host"] / ".stage" / "t" / part["name"]).stat().st_size
        assert on_disk == part["size"] and on_disk + size <= BUDGET
    spans = [part["name"] for part in m["parts"] if any(c["file"] == "big.bin" for c in part["chunks"])]
    assert len(spans) >= 4  # the big file is cut across parts
    for name in names:
        assert f'[".stage/t/manifest.json", ".stage/t/{name}"]' in payload["pack_out"]


def test_parts_one_call_each_reassemble_byte_identical(payload):
    names = [part["name"] for part in manifest(payload)["parts"]]
    for i, name in enumerate(names):
        r = call(payload, name)
        if i < len(names) - 1:
            assert r.returncode == 3, r.stdout + r.stderr
            assert f"staged {i + 1}/{len(names)} parts" in r.stdout
            assert f'"{".stage/t/" + names[i + 1]}"' in r.stdout  # the next call's carry
            assert "FRESH" not in r.stdout
        else:
            assert r.returncode == 0, r.stdout + r.stderr
            assert "complete" in r.stdout
    files = payload["root"] / "t" / "files"
    for src_name, staged_name in payload["names"].items():
        assert (files / staged_name).read_bytes() == (payload["src"] / src_name).read_bytes(), staged_name
    assert not list(files.rglob(".*.tmp"))
    assert status(payload)["state"] == "complete"
    # A later call of the same lease that carries nothing: still complete.
    r = call(payload, manifest_too=False)
    assert r.returncode == 0 and "complete" in r.stdout


def test_corrupt_chunk_is_refused_naming_part_and_file(payload):
    good = (payload["host"] / ".stage" / "t" / "part-01").read_bytes()
    chunk = next(c for c in manifest(payload)["parts"][1]["chunks"] if c["file"] == "big.bin")
    bad = bytearray(good)
    bad[chunk["part_offset"] + 7] ^= 0xFF
    (payload["host"] / ".stage" / "t" / "part-01").write_bytes(bytes(bad))
    r = call(payload, "part-01")
    assert r.returncode == 1
    assert "part-01" in r.stderr and "big.bin" in r.stderr and "corrupt" in r.stderr
    assert "part-01" not in status(payload)["staged"]
    assert not (payload["root"] / "t" / "parts" / "part-01").exists()
    (payload["host"] / ".stage" / "t" / "part-01").write_bytes(good)
    r = call(payload, "part-01")
    assert r.returncode == 3 and "part-01 verified and staged" in r.stdout


def test_a_truncated_part_is_refused(payload):
    path = payload["host"] / ".stage" / "t" / "part-00"
    path.write_bytes(path.read_bytes()[:-1])
    r = call(payload, "part-00")
    assert r.returncode == 1 and "part-00" in r.stderr and "bytes carried" in r.stderr


def test_fresh_machine_receiving_part_two_says_so(payload):
    r = call(payload, "part-02")
    assert r.returncode == 3
    assert "FRESH MACHINE" in r.stdout and "released" in r.stdout
    assert "Send part-00..part-01 again" in r.stdout
    # What it carried is kept: the missing earlier parts then complete the set.
    assert status(payload)["staged"] == ["part-02"]
    for name in ("part-00", "part-01", "part-03"):
        assert call(payload, name).returncode == 3
    assert call(payload, "part-04").returncode == 0


def test_cold_machine_with_nothing_carried(payload):
    r = call(payload, manifest_too=False)
    assert r.returncode == 4 and "cold machine" in r.stdout and "part-00" in r.stdout
    assert status(payload)["state"] == "cold"


def test_changed_manifest_starts_over(payload):
    assert call(payload, "part-00").returncode == 3
    assert call(payload, "part-01").returncode == 3
    old = status(payload)["manifest_sha256"]
    (payload["src"] / "dir" / "a.whl").write_bytes(b"another version")
    assert stage("pack", "t", payload["src"] / "big.bin", payload["src"] / "dir", "--part-bytes", BUDGET,
                 cwd=payload["host"]).returncode == 0
    r = call(payload, "part-00")
    assert r.returncode == 3 and "differs from the one staged earlier" in r.stdout and "starting over" in r.stdout
    now = status(payload)
    assert now["manifest_sha256"] != old and now["staged"] == ["part-00"]


def test_receiving_the_same_part_twice_is_fine(payload):
    assert call(payload, "part-00").returncode == 3
    r = call(payload, "part-00")
    assert r.returncode == 3 and "part-00 was staged already" in r.stdout
    assert status(payload)["staged"] == ["part-00"]
    for name in ("part-01", "part-02", "part-03", "part-04"):
        call(payload, name)
    r = call(payload, "part-04")
    assert r.returncode == 0 and "complete" in r.stdout


def test_pack_refuses_a_budget_too_small_for_the_manifest(payload):
    r = stage("pack", "small", payload["src"] / "dir", "--part-bytes", 300, cwd=payload["host"])
    assert r.returncode == 1 and "too small" in r.stderr and "manifest" in r.stderr
    assert not (payload["host"] / ".stage" / "small").exists()


def test_pack_refuses_more_parts_than_one_lease_takes(payload):
    r = stage("pack", "many", payload["src"] / "big.bin", "--part-bytes", 100_000, "--max-parts", 20,
              cwd=payload["host"])
    assert r.returncode == 1 and "--max-parts 20" in r.stderr


def test_pack_accepts_fractional_mib(payload):
    r = stage("pack", "frac", payload["src"] / "big.bin", "--part-mb", "0.5", cwd=payload["host"])
    assert r.returncode == 0, r.stderr
    raw = (payload["host"] / ".stage" / "frac" / "manifest.json").read_bytes()
    parts = json.loads(raw)["parts"]
    assert len(parts) == 9 and all(p["size"] + len(raw) <= 1 << 19 for p in parts)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_pack_in_a_checkout_checks_ignore_and_the_call_limit(payload):
    repo = payload["tmp"] / "repo"
    repo.mkdir()
    env = os.environ | {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=env)
    (repo / "tracked.bin").write_bytes(b"x" * 1_500_000)
    big = payload["src"] / "big.bin"
    r = stage("pack", "t", big, "--part-bytes", BUDGET, cwd=repo)
    assert r.returncode == 1 and "not git-ignored" in r.stderr
    (repo / ".gitignore").write_text(".stage/\n")
    r = stage("pack", "t", big, "--part-bytes", BUDGET, "--call-mib", 2, cwd=repo)
    assert r.returncode == 1 and "exceed the 2" in r.stderr  # 1.5 MB of tree + 1 MB of parts > 2 MiB
    r = stage("pack", "t", big, "--part-bytes", BUDGET, "--call-mib", 3, cwd=repo)
    assert r.returncode == 0, r.stderr


def test_this_repo_ignores_the_staged_sets():
    for path in (".stage/te/part-00", ".whl-te/x.whl"):
        r = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO)
        assert r.returncode == 0, f"{path} is not git-ignored: every device call would copy it with the tree"
