"""Download Kaiyuan-2B pretraining phases from the Hugging Face hub (or a mirror: HF_ENDPOINT) with
huggingface_hub, resumable, and verify every file against the hub's own size and hash (the LFS
sha256, or the git blob sha1 for small files). A file that fails verification is removed and fetched
once more; if it fails again the download stops with the file named."""

from __future__ import annotations

import fnmatch
import hashlib
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

DEFAULT_REPO_ID = "thu-pacman/PCMind-2.1-Kaiyuan-2B"
# Files of phase N live under a directory named after the phase; override when a mirror differs.
DEFAULT_PHASE_PATTERN = "*phase{n}/*"


class DownloadError(RuntimeError):
    pass


def parse_phases(spec: str) -> list[int]:
    """'1-5' -> [1..5]; '1,3' -> [1, 3]; '2' -> [2]."""
    phases: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                phases.update(range(lo, hi + 1))
            else:
                phases.add(int(part))
        except ValueError:
            raise DownloadError(f"--phases: cannot read {part!r}; expected e.g. 1-5 or 1,3") from None
    bad = sorted(p for p in phases if not 1 <= p <= 5)
    if bad:
        raise DownloadError(f"--phases: Kaiyuan-2B has phases 1-5, got {bad}")
    return sorted(phases)


@dataclass
class PlannedFile:
    path: str
    size: int
    sha256: str | None   # LFS files
    git_sha1: str | None  # the blob id, for files stored in git itself


def plan(api: Any, repo_id: str, revision: str | None, patterns: list[str]) -> list[PlannedFile]:
    from huggingface_hub.hf_api import RepoFile

    files = []
    for entry in api.list_repo_tree(repo_id, repo_type="dataset", revision=revision, recursive=True, expand=False):
        if not isinstance(entry, RepoFile) or not any(fnmatch.fnmatch(entry.path, p) for p in patterns):
            continue
        lfs = entry.lfs
        files.append(PlannedFile(entry.path, entry.size, lfs.sha256 if lfs else None, None if lfs else entry.blob_id))
    return sorted(files, key=lambda f: f.path)


def verify_file(local: Path, expected: PlannedFile) -> str | None:
    """None when the file matches the hub's record, else what is wrong."""
    if not local.is_file():
        return "missing after download"
    size = local.stat().st_size
    if size != expected.size:
        return f"size {size} != {expected.size} on the hub"
    if expected.sha256:
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1()
        digest.update(f"blob {size}\0".encode())
    with open(local, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    want = expected.sha256 or expected.git_sha1
    if want and digest.hexdigest() != want:
        return f"{'sha256' if expected.sha256 else 'git sha1'} {digest.hexdigest()} != {want} on the hub"
    return None


@contextmanager
def hub_errors(endpoint: str | None, what: str) -> Iterator[None]:
    """A hub or network failure as one DownloadError naming the endpoint and what was asked (huggingface_hub's
    own errors and httpx's: refused connection, DNS, timeouts, HTTP status)."""
    import httpx
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        yield
    except (httpx.HTTPError, ConnectionError, LocalEntryNotFoundError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DownloadError(f"{endpoint or constants.ENDPOINT}: {what} failed: {reason}") from None


def download_phases(
    dest: Path,
    phases: list[int],
    repo_id: str = DEFAULT_REPO_ID,
    revision: str | None = None,
    pattern: str = DEFAULT_PHASE_PATTERN,
    endpoint: str | None = None,
    token: str | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    from huggingface_hub import HfApi, hf_hub_download

    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None  # mirrors
    api = HfApi(endpoint=endpoint, token=token)  # token None: huggingface_hub reads HF_TOKEN itself
    patterns = [pattern.format(n=n) for n in phases]
    with hub_errors(endpoint, f"listing the files of {repo_id}@{revision or 'main'}"):
        files = plan(api, repo_id, revision, patterns)
    if not files:
        raise DownloadError(f"{repo_id}@{revision or 'main'}: no files match {patterns}")
    empty = [n for n, p in zip(phases, patterns) if not any(fnmatch.fnmatch(f.path, p) for f in files)]
    if empty:  # every requested phase must be there, not just some
        raise DownloadError(f"{repo_id}@{revision or 'main'}: phase(s) {', '.join(map(str, empty))} have no files "
                            f"(pattern {pattern!r}); nothing was downloaded")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    report: dict[str, Any] = {"repo_id": repo_id, "revision": revision, "files": [], "repaired": []}
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  disable=not show_progress) as bar:
        task = bar.add_task(f"phases {','.join(map(str, phases))}", total=sum(f.size for f in files))
        for f in files:
            for attempt in (1, 2):
                with hub_errors(endpoint, f"downloading {repo_id}/{f.path}"):
                    local = Path(hf_hub_download(repo_id, f.path, repo_type="dataset", revision=revision,
                                                 local_dir=dest, endpoint=endpoint, token=token,
                                                 force_download=attempt == 2))
                problem = verify_file(local, f)
                if problem is None:
                    break
                local.unlink(missing_ok=True)  # never leave a bad file under its final name
                if attempt == 2:
                    raise DownloadError(f"{f.path}: {problem} (after a fresh download; removed)")
                report["repaired"].append({"path": f.path, "problem": problem})
            bar.advance(task, f.size)
            report["files"].append({"path": f.path, "size": f.size, "sha256": f.sha256, "git_sha1": f.git_sha1})
    report["bytes"] = sum(f["size"] for f in report["files"])
    return report
