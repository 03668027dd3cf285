"""Where a result file came from, read from its own fields (what benchmarks/provenance.py writes, and the older
forms: revision / rev / git_rev; host as a dict, a string or a list; command as a string or a list)."""

from __future__ import annotations

from typing import Any

from resultsdoc.entries import Data


def revision_of(data: Data) -> str:
    rev = data.get("revision", data.get("rev", data.get("git_rev")))
    if isinstance(rev, dict):
        return ", ".join(f"{k} {v}" for k, v in rev.items())
    if isinstance(rev, list):  # one per part of a run made in several device calls (the journey)
        return " / ".join(str(r) for r in rev)
    return str(rev) if rev else "unknown"


def _one_host(host: Any) -> str:
    if isinstance(host, dict):
        if "logs_from" in host:
            return str(host["logs_from"])
        if host.get("gpu"):
            return f"{host.get('gpus', 1)}×{host['gpu']}"
        cores = host.get("cpus", host.get("cores"))
        return f"CPU host, {cores} cores" if cores else "CPU host"
    return str(host)


def host_of(data: Data) -> str:
    host = data.get("host")
    if host == "see runs" and data.get("runs"):
        return "; ".join(dict.fromkeys(_one_host(run.get("host")) for run in data["runs"]))
    if isinstance(host, list):
        gpus = data.get("gpu") if isinstance(data.get("gpu"), list) else []
        return ", ".join(dict.fromkeys([*map(_one_host, host), *gpus]))
    return _one_host(host) if host else "unknown host"


def commands_of(data: Data) -> list[str]:
    command = data.get("command")
    return [str(c) for c in command] if isinstance(command, list) else [str(command)] if command else []


def source_line(name: str, data: Data) -> str:
    commands = "; ".join(f"`{c}`" for c in commands_of(data)) or "no command recorded"
    return f"`results/{name}` (rev {revision_of(data)}, {host_of(data)}, {data.get('date', 'no date')}): {commands}"
