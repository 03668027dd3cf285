"""A benchmarked command run as a whole process tree: wall time, peak RSS summed over the tree, the CPU seconds of
every process in it, and the peak size on disk of named state folders. The data benchmarks' (convert, clean)
measure their command and its baseline with it."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import psutil


def run_measured(cmd: list[str], cwd: Path, state_dirs: dict[str, Path] | None = None) -> dict:
    """Wall time; peak RSS summed over the process tree and the CPU seconds of every process in it (sampled every
    50 ms); the peak size on disk of each of state_dirs (sampled every second)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, cpu, disk = 0, {}, dict.fromkeys(state_dirs or {}, 0)
    stop = threading.Event()

    def sample():
        nonlocal peak
        root, ticks = psutil.Process(proc.pid), 0
        while not stop.is_set():
            try:
                procs = [root] + root.children(recursive=True)
                rss = 0
                for p in procs:
                    with p.oneshot():
                        rss += p.memory_info().rss
                        t = p.cpu_times()
                        cpu[p.pid] = max(cpu.get(p.pid, 0.0), t.user + t.system)
                peak = max(peak, rss)
            except psutil.Error:
                pass
            if ticks % 20 == 0:
                for name, folder in (state_dirs or {}).items():
                    try:  # files come and go while the command runs
                        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0
                    except OSError:
                        continue
                    disk[name] = max(disk[name], size)
            ticks += 1
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.communicate()[0]
    stop.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}):\n{output[-3000:]}")
    out = {"seconds": time.perf_counter() - start, "cpu_seconds": sum(cpu.values()), "peak_rss_mb": peak / 2**20}
    return out | {f"peak_{name}_disk_mb": size / 2**20 for name, size in disk.items()}
