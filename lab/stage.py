#!/usr/bin/env python3
"""A payload larger than one device call, carried in parts over back-to-back calls. Standard library only: the GPU
host runs it with its plain python3.

  python3 lab/stage.py pack NAME FILE_OR_DIR... [--part-mb 56 | --part-bytes N] [--out .stage]   (this host)
  python3 lab/stage.py receive NAME [--src .stage] [--root /tmp/stage]                           (GPU host)
  python3 lab/stage.py status NAME [--root /tmp/stage]

`pack` cuts the files into .stage/NAME/part-NN (a big file spans parts) and writes .stage/NAME/manifest.json (every
file's size and sha256, every chunk's place and sha256); it prints the `carry` list of each call: the manifest and
one part, together at most --part-mb. `receive`, in each call, verifies the carried part chunk by chunk, keeps it in
ROOT/NAME/parts and, once every part is there, writes ROOT/NAME/files/. /tmp on the GPU host lasts only while the
machine stays held, so a part that finds nothing staged before it (and is not part-00) means a fresh machine.
Exit codes (receive, status): 0 complete, 3 more parts needed, 4 cold (nothing staged, nothing carried),
1 a check failed, 2 usage.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

COMPLETE, FAILED, USAGE, MORE, COLD = 0, 1, 2, 3, 4
MiB = 1 << 20
BLOCK = 4 * MiB
PLACEHOLDER = "0" * 64  # a sha256 is always 64 hex digits, so the manifest's size is known before any hashing


class StageError(Exception):
    """A check failed; the message says which part or file and what was expected."""


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1) + "\n").encode()


# ---------------------------------------------------------------- pack (the CPU host)


def collect_inputs(paths: list[str]) -> list[tuple[str, Path]]:
    """(name in the staged set, path here): a file keeps its base name, a directory's files their paths inside it."""
    found: dict[str, Path] = {}
    for arg in paths:
        p = Path(arg)
        if p.is_file():
            items = [(p.name, p)]
        elif p.is_dir():
            items = [(f.relative_to(p).as_posix(), f) for f in sorted(p.rglob("*")) if f.is_file()]
        else:
            raise StageError(f"{arg}: no such file or directory")
        for name, f in items:
            if name in found:
                raise StageError(f"two inputs are both staged as {name!r}: {found[name]} and {f}")
            found[name] = f
    if not found:
        raise StageError(f"nothing to pack in {' '.join(paths)}")
    return sorted(found.items())


def layout(sizes: list[tuple[str, int]], capacity: int) -> list[list[dict]]:
    """The files laid end to end and cut every `capacity` bytes: each part's chunks (file, file and part offsets)."""
    parts: list[list[dict]] = [[]]
    room = capacity
    for name, size in sizes:
        offset = 0
        while True:
            if room == 0 and offset < size:
                parts.append([])
                room = capacity
            length = min(room, size - offset)
            parts[-1].append({"file": name, "file_offset": offset, "part_offset": capacity - room,
                              "length": length, "sha256": PLACEHOLDER})
            room -= length
            offset += length
            if offset >= size:
                break
    return parts


def plan_manifest(name: str, sizes: list[tuple[str, int]], budget: int, max_parts: int) -> dict:
    """Parts sized so that the manifest plus one part fit the budget of one call (a fixed point on the manifest)."""
    reserve = 0
    for _ in range(50):
        chunks = layout(sizes, budget - reserve)
        width = max(2, len(str(len(chunks) - 1)))
        manifest = {"format": 1, "name": name, "budget_bytes": budget,
                    "files": [{"name": n, "size": s, "sha256": PLACEHOLDER} for n, s in sizes],
                    "parts": [{"name": f"part-{i:0{width}d}", "size": sum(c["length"] for c in cs), "chunks": cs}
                              for i, cs in enumerate(chunks)]}
        size = len(manifest_bytes(manifest))
        if size >= budget:
            raise StageError(f"--part-mb is too small: each call carries the manifest and one part in {budget} bytes, "
                             f"and the manifest alone is {size} bytes")
        if len(chunks) > max_parts:
            raise StageError(f"{len(chunks)} parts is more than --max-parts {max_parts}: one lease (30 minutes held "
                             "at most) must receive them all; raise --part-mb")
        if size <= reserve:
            return manifest
        reserve = size
    raise StageError("the manifest's size did not settle; use a larger --part-mb")


def working_tree_bytes() -> int | None:
    """What the device tool copies besides `carry`: tracked and untracked-but-not-ignored files (None: not git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum(os.path.getsize(f) for f in out.stdout.decode().split("\0") if f and os.path.isfile(f))


def check_ignored(path: Path) -> None:
    """A part that git does not ignore would travel with the tree in every call (and blow the limit)."""
    try:
        rc = subprocess.run(["git", "check-ignore", "-q", str(path)], capture_output=True).returncode
    except OSError:
        return
    if rc == 1:
        raise StageError(f"{path} is not git-ignored: add its folder to .gitignore, or every device call copies "
                         "all the parts with the working tree")


def pack(args) -> int:
    budget = args.part_bytes if args.part_bytes else int(args.part_mb * MiB)
    inputs = collect_inputs(args.paths)
    manifest = plan_manifest(args.name, [(n, p.stat().st_size) for n, p in inputs], budget, args.max_parts)
    out = Path(args.out) / args.name
    check_ignored(out / "manifest.json")
    tree = working_tree_bytes()
    if tree is not None and tree + budget > args.call_mib * MiB:
        raise StageError(f"the working tree ({tree / 1e6:.1f} MB, tracked + untracked not ignored) and one "
                         f"call's parts ({budget / 1e6:.1f} MB) exceed the {args.call_mib} MiB a call carries; "
                         "lower --part-mb")
    if out.exists():
        shutil.rmtree(out)  # parts of an earlier pack must not be carried with this manifest
    out.mkdir(parents=True)
    paths = dict(inputs)
    file_hash = {n: hashlib.sha256() for n, _ in inputs}
    current, src = None, None  # a file's chunks are consecutive, so one open file at a time
    for part in manifest["parts"]:
        with open(out / part["name"], "wb") as dst:
            for chunk in part["chunks"]:
                if chunk["file"] != current:
                    if src:
                        src.close()
                    current, src = chunk["file"], open(paths[chunk["file"]], "rb")
                h, left = hashlib.sha256(), chunk["length"]
                while left:
                    block = src.read(min(BLOCK, left))
                    if not block:
                        raise StageError(f"{paths[current]} shrank while it was packed")
                    h.update(block)
                    file_hash[current].update(block)
                    dst.write(block)
                    left -= len(block)
                chunk["sha256"] = h.hexdigest()
    if src:
        src.close()
    for f in manifest["files"]:
        f["sha256"] = file_hash[f["name"]].hexdigest()
    raw = manifest_bytes(manifest)
    write_atomic(out / "manifest.json", raw)
    total = sum(f["size"] for f in manifest["files"])
    rel = os.path.relpath(out)
    print(f"{args.name}: {len(manifest['files'])} files, {total:,} bytes in {len(manifest['parts'])} parts; each call "
          f"carries the manifest ({len(raw):,} bytes) and one part, at most {budget:,} bytes together")
    print("carry, one device call per line, back to back (the machine goes back after ~30 s idle):")
    for i, part in enumerate(manifest["parts"], 1):
        print(f"  call {i}: {json.dumps([f'{rel}/manifest.json', f'{rel}/' + part['name']])}")
    if tree is None:
        print("(not in a git checkout: the working tree's share of a call was not checked)")
    return 0


# ---------------------------------------------------------------- receive (the GPU host)


def load_manifest(raw: bytes, name: str) -> dict:
    try:
        manifest = json.loads(raw)
        assert manifest["format"] == 1 and manifest["name"] == name
        for f in manifest["files"]:
            n = f["name"]
            assert n and not n.startswith("/") and ".." not in Path(n).parts, n
        for p in manifest["parts"]:
            assert re.fullmatch(r"part-\d+", p["name"]), p["name"]
    except (ValueError, KeyError, TypeError, AssertionError) as e:
        raise StageError(f"the carried manifest is not a stage.py manifest for {name!r} ({e!r})") from None
    return manifest


def load_state(stage: Path) -> dict | None:
    try:
        return json.loads((stage / "state.json").read_text())
    except (OSError, ValueError):
        return None


def save_state(stage: Path, state: dict) -> None:
    write_atomic(stage / "state.json", (json.dumps(state, indent=1) + "\n").encode())


def copy_verified(part: dict, src: Path, dst: Path) -> None:
    """Copy a carried part, checking its size and each chunk's sha256 on the way; only a whole good part lands."""
    size = src.stat().st_size
    if size != part["size"]:
        raise StageError(f"{part['name']}: {size} bytes carried, the manifest says {part['size']}: re-send it")
    tmp = dst.with_name(f".{dst.name}.tmp")
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        for chunk in part["chunks"]:
            h, left = hashlib.sha256(), chunk["length"]
            while left:
                block = fin.read(min(BLOCK, left))
                h.update(block)
                fout.write(block)
                left -= len(block)
            if h.hexdigest() != chunk["sha256"]:
                tmp.unlink()
                end = chunk["file_offset"] + chunk["length"]
                raise StageError(f"{part['name']}: the chunk of {chunk['file']} (its bytes {chunk['file_offset']}.."
                                 f"{end}) has sha256 {h.hexdigest()[:16]}…, the manifest says "
                                 f"{chunk['sha256'][:16]}…: the part is corrupt; pack again or re-send it")
    os.replace(tmp, dst)


def assemble(manifest: dict, stage: Path) -> Path:
    """Every file from its chunks into files/ (a temporary name, the whole file's sha256 checked, then renamed)."""
    files = stage / "files"
    chunks: dict[str, list] = {}
    for part in manifest["parts"]:
        for c in part["chunks"]:
            chunks.setdefault(c["file"], []).append((c["file_offset"], c, part["name"]))
    for f in manifest["files"]:
        dst = files / f["name"]
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.tmp")
        h = hashlib.sha256()
        with open(tmp, "wb") as out:
            for _, c, part_name in sorted(chunks.get(f["name"], []), key=lambda t: t[0]):
                with open(stage / "parts" / part_name, "rb") as src:
                    src.seek(c["part_offset"])
                    left = c["length"]
                    while left:
                        block = src.read(min(BLOCK, left))
                        h.update(block)
                        out.write(block)
                        left -= len(block)
        if h.hexdigest() != f["sha256"] or tmp.stat().st_size != f["size"]:
            tmp.unlink()
            raise StageError(f"{f['name']}: reassembled, its sha256 is {h.hexdigest()[:16]}…, the manifest says "
                             f"{f['sha256'][:16]}…")
        os.replace(tmp, dst)
    shutil.rmtree(stage / "parts")  # the files are verified; the parts would only double the disk used
    return files


def describe(name: str, src: str, manifest: dict, state: dict) -> tuple[list, list]:
    names = [p["name"] for p in manifest["parts"]]
    staged = [n for n in names if n in state["staged"]]
    missing = [n for n in names if n not in state["staged"]]
    print(f"{name}: staged {len(staged)}/{len(names)} parts: {', '.join(staged) or 'none'}; "
          f"missing: {', '.join(missing) or 'none'}")
    if missing:
        print(f"{name}: more parts needed; next call: carry "
              f"{json.dumps([f'{src}/{name}/manifest.json', f'{src}/{name}/{missing[0]}'])}")
    return staged, missing


def receive(args) -> int:
    name, stage = args.name, Path(args.root) / args.name
    carried = Path(args.src) / name
    state = load_state(stage)
    if not (carried / "manifest.json").is_file():
        if state and state.get("complete"):
            print(f"{name}: complete (staged earlier on this machine): {stage / 'files'}")
            return COMPLETE
        if state:
            describe(name, args.src, json.loads((stage / "manifest.json").read_bytes()), state)
            print(f"{name}: no manifest carried ({carried}/manifest.json); carry it with each part")
            return MORE
        print(f"{name}: cold machine: nothing staged in {stage} and nothing carried; staging starts again from "
              f"part-00 (carry {args.src}/{name}/manifest.json and {args.src}/{name}/part-00)")
        return COLD
    raw = (carried / "manifest.json").read_bytes()
    manifest, digest = load_manifest(raw, name), hashlib.sha256(raw).hexdigest()
    if state and state["manifest_sha256"] != digest:
        print(f"{name}: the carried manifest ({digest[:12]}) differs from the one staged earlier "
              f"({state['manifest_sha256'][:12]}): starting over")
        shutil.rmtree(stage)
        state = None
    fresh = state is None
    if fresh:
        (stage / "parts").mkdir(parents=True, exist_ok=True)
        write_atomic(stage / "manifest.json", raw)
        state = {"manifest_sha256": digest, "staged": [], "complete": False, "first_received": time.time()}
    names = [p["name"] for p in manifest["parts"]]
    present = [p for p in manifest["parts"] if (carried / p["name"]).is_file()]
    errors = []
    for part in present:
        if state["complete"] or part["name"] in state["staged"]:
            print(f"{name}: {part['name']} was staged already")
            continue
        try:
            copy_verified(part, carried / part["name"], stage / "parts" / part["name"])
        except StageError as e:
            errors.append(str(e))
            continue
        state["staged"].append(part["name"])
        save_state(stage, state)
        print(f"{name}: {part['name']} verified and staged ({part['size']:,} bytes)")
    save_state(stage, state)
    first = names.index(present[0]["name"]) if present else None
    if fresh and first:
        print(f"{name}: FRESH MACHINE: nothing was staged here before this call, and it carried {names[first]}, not "
              f"{names[0]}: the machine was released since the earlier parts were sent. Send "
              f"{names[0] if first == 1 else names[0] + '..' + names[first - 1]} again, in back-to-back calls.")
    for e in errors:
        print(f"{name}: REFUSED {e}", file=sys.stderr)
    if state["complete"]:
        print(f"{name}: complete: {stage / 'files'}")
        return FAILED if errors else COMPLETE
    _, missing = describe(name, args.src, manifest, state)
    if errors:
        return FAILED
    if missing:
        return MORE
    files = assemble(manifest, stage)
    state.update(complete=True, completed=time.time())
    save_state(stage, state)
    print(f"{name}: complete: {len(manifest['files'])} files reassembled and verified in {files} "
          f"({state['completed'] - state['first_received']:.0f} s after the first part arrived)")
    return COMPLETE


def status(args) -> int:
    stage = Path(args.root) / args.name
    state = load_state(stage)
    if state is None:
        print(json.dumps({"name": args.name, "root": str(stage), "state": "cold", "staged": []}, indent=1))
        return COLD
    manifest = json.loads((stage / "manifest.json").read_bytes())
    names = [p["name"] for p in manifest["parts"]]
    report = {"name": args.name, "root": str(stage), "state": "complete" if state["complete"] else "partial",
              "manifest_sha256": state["manifest_sha256"], "parts_total": len(names),
              "staged": names if state["complete"] else [n for n in names if n in state["staged"]],
              "missing": [] if state["complete"] else [n for n in names if n not in state["staged"]],
              "files": [f["name"] for f in manifest["files"]],
              "first_received": state["first_received"], "completed": state.get("completed")}
    if state["complete"]:
        report["files_dir"] = str(stage / "files")
    print(json.dumps(report, indent=1))
    return COMPLETE if state["complete"] else MORE


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="cut files into parts and a manifest (the CPU host)")
    p.add_argument("name")
    p.add_argument("paths", nargs="+", metavar="FILE_OR_DIR")
    p.add_argument("--part-mb", type=float, default=56.0, help="MiB one call carries: the manifest and one part")
    p.add_argument("--part-bytes", type=int, help="the same budget in bytes (tests)")
    p.add_argument("--out", default=".stage", help="where NAME/ is written; carry paths are relative to here")
    p.add_argument("--max-parts", type=int, default=20, help="refuse a split into more parts than this")
    p.add_argument("--call-mib", type=float, default=64, help="what one device call carries in all, tree included")
    for cmd, text in (("receive", "stage the carried parts (the GPU host)"), ("status", "the staged state, as JSON")):
        p = sub.add_parser(cmd, help=text)
        p.add_argument("name")
        p.add_argument("--root", default="/tmp/stage", help="where NAME/ is staged")
        if cmd == "receive":
            p.add_argument("--src", default=".stage", help="where the carried NAME/ is")
    args = ap.parse_args(argv)
    try:
        return {"pack": pack, "receive": receive, "status": status}[args.command](args)
    except StageError as e:
        print(f"stage.py {args.command} {args.name}: {e}", file=sys.stderr)
        return FAILED


if __name__ == "__main__":
    sys.exit(main())
