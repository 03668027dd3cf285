"""`kaiyuan data download` against a real local HTTP server speaking the hub's file API, through the
real huggingface_hub client: phase selection, verification, resume, corruption, mirror endpoint."""

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fake_hub import FakeHub

from kaiyuan_recipes.data.download import DownloadError, download_phases, parse_phases

REPO = "kaiyuan-test/phases"


def parquet_bytes(n: int, seed: int) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [f"phase doc {seed}-{i} " * 40 for i in range(n)]}), buf, compression="none")
    return buf.getvalue()


@pytest.fixture(autouse=True)
def online_to_loopback_only(monkeypatch):
    """The suite runs with HF_HUB_OFFLINE=1; these tests talk to the fake hub on 127.0.0.1 only."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub():
    files = {
        "phase1/part-000.parquet": parquet_bytes(200, 1),
        "phase1/part-001.parquet": parquet_bytes(150, 2),
        "phase2/part-000.parquet": parquet_bytes(100, 3),
        "phase3/part-000.parquet": parquet_bytes(50, 4),
        "README.md": b"# fake dataset\n",
    }
    with FakeHub(REPO, files, lfs={p for p in files if p.endswith(".parquet")}) as server:
        yield server


def test_parse_phases():
    assert parse_phases("1-5") == [1, 2, 3, 4, 5]
    assert parse_phases("1,3") == [1, 3]
    with pytest.raises(DownloadError, match="phases 1-5, got \\[6\\]"):
        parse_phases("5-6")
    with pytest.raises(DownloadError, match="cannot read 'x'"):
        parse_phases("x")


def test_downloads_selected_phases_and_verifies(hub, tmp_path):
    report = download_phases(tmp_path, [1, 2], repo_id=REPO, endpoint=hub.url, show_progress=False)
    got = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.parquet"))
    assert got == ["phase1/part-000.parquet", "phase1/part-001.parquet", "phase2/part-000.parquet"]
    for path in got:
        assert (tmp_path / path).read_bytes() == hub.files[path]
    assert report["bytes"] == sum(len(hub.files[p]) for p in got) and not report["repaired"]
    assert pq.ParquetFile(tmp_path / "phase1/part-000.parquet").metadata.num_rows == 200


def test_hf_endpoint_and_token_from_environment(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_for_test")
    download_phases(tmp_path, [3], repo_id=REPO, show_progress=False)
    assert (tmp_path / "phase3/part-000.parquet").read_bytes() == hub.files["phase3/part-000.parquet"]
    assert all(r["auth"] == "Bearer hf_secret_for_test" for r in hub.requests)


def test_interrupted_download_resumes(hub, tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    # The client writes in DOWNLOAD_CHUNK_SIZE pieces (10 MB); our test files are ~130 kB.
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 8192)
    hub.interrupt_once.add("phase1/part-000.parquet")
    try:
        download_phases(tmp_path, [1], repo_id=REPO, endpoint=hub.url, show_progress=False)
    except Exception:
        download_phases(tmp_path, [1], repo_id=REPO, endpoint=hub.url, show_progress=False)  # the user re-runs
    assert (tmp_path / "phase1/part-000.parquet").read_bytes() == hub.files["phase1/part-000.parquet"]
    gets = [r for r in hub.requests if r["method"] == "GET" and r.get("path") == "phase1/part-000.parquet"]
    assert len(gets) >= 2 and gets[-1]["range_start"] > 0  # the second transfer resumed, not restarted


def test_corruption_on_the_wire_is_detected_and_nothing_kept(hub, tmp_path):
    hub.corrupt.add("phase2/part-000.parquet")
    with pytest.raises(DownloadError,
                       match="phase2/part-000.parquet: sha256 .* on the hub .after a fresh download; removed"):
        download_phases(tmp_path, [2], repo_id=REPO, endpoint=hub.url, show_progress=False)
    assert not (tmp_path / "phase2/part-000.parquet").exists()


def test_locally_corrupted_file_is_repaired(hub, tmp_path):
    download_phases(tmp_path, [3], repo_id=REPO, endpoint=hub.url, show_progress=False)
    path = tmp_path / "phase3/part-000.parquet"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    report = download_phases(tmp_path, [3], repo_id=REPO, endpoint=hub.url, show_progress=False)
    assert report["repaired"] and "sha256" in report["repaired"][0]["problem"]
    assert path.read_bytes() == hub.files["phase3/part-000.parquet"]


def test_no_matching_files(hub, tmp_path):
    with pytest.raises(DownloadError, match="no files match \\['\\*phase5/\\*'\\]"):
        download_phases(tmp_path, [5], repo_id=REPO, endpoint=hub.url, show_progress=False)


def test_a_requested_phase_with_no_files_is_an_error_naming_it(hub, tmp_path):
    with pytest.raises(DownloadError, match="phase\\(s\\) 4, 5 have no files"):
        download_phases(tmp_path, [1, 2, 3, 4, 5], repo_id=REPO, endpoint=hub.url, show_progress=False)
    assert not list(tmp_path.rglob("*.parquet"))


def test_an_unreachable_endpoint_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    import socket

    from kaiyuan_recipes.cli.main import main as kaiyuan

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    assert kaiyuan(["data", "download", "--phases", "1", "--dest", str(tmp_path / "d"), "--repo-id", REPO]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kaiyuan: error: http://127.0.0.1:{port}: listing the files of {REPO}@main failed: ")
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_a_file_the_hub_refuses_is_named_with_the_endpoint(hub, tmp_path):
    def not_found(handler, body):
        handler.send_response(404)
        handler.send_header("X-Error-Code", "EntryNotFound")
        handler.end_headers()

    hub._resolve = not_found  # the listing names the files, their downloads fail
    with pytest.raises(DownloadError, match=f"^{hub.url}: downloading {REPO}/phase3/part-000.parquet failed: "):
        download_phases(tmp_path, [3], repo_id=REPO, endpoint=hub.url, show_progress=False)
