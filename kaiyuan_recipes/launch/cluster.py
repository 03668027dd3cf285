"""Cluster bring-up as the original README prescribed: the same-named container on every host
(`docker run -d --gpus all --network=host --ipc=host --shm-size=64g` + mounts, kept alive), removed again
with `down`; `check` runs a NCCL/gloo all-reduce across all nodes through the multi-node launcher."""

from __future__ import annotations

import shlex
from typing import Any

from kaiyuan_recipes.launch.ssh import MultiNodeSpec, run_on


def up_argv(container: str, image: str, mounts: list[str] = (), env: dict[str, str] | None = None,
            shm_size: str = "64g") -> list[str]:
    from kaiyuan_recipes.launch.ssh import CONTAINER_NAME

    if not CONTAINER_NAME.fullmatch(container):
        raise ValueError(f"--container-name {container!r}: expected a docker container name "
                         "([A-Za-z0-9][A-Za-z0-9_.-]*)")
    if not image or image.startswith("-") or any(c.isspace() for c in image):
        raise ValueError(f"--image {image!r}: expected an image reference (not an option)")
    if any(m.startswith("-") for m in mounts) or shm_size.startswith("-"):
        raise ValueError("--mount / --shm-size: a value starting with '-' would be read by docker as an option")
    argv = ["docker", "run", "-d", "--name", container, "--gpus", "all", "--network=host", "--ipc=host",
            f"--shm-size={shm_size}", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864", "--restart", "no"]
    for mount in mounts:
        if ":" not in mount:
            raise ValueError(f"--mount {mount!r}: expected HOST_PATH:CONTAINER_PATH")
        argv += ["-v", mount]
    for key, value in (env or {}).items():
        argv += ["-e", f"{key}={value}"]
    return argv + [image, "sleep", "infinity"]


def down_argv(container: str) -> list[str]:
    from kaiyuan_recipes.launch.ssh import CONTAINER_NAME

    if not CONTAINER_NAME.fullmatch(container):
        raise ValueError(f"--container-name {container!r}: expected a docker container name "
                         "([A-Za-z0-9][A-Za-z0-9_.-]*)")
    return ["docker", "rm", "-f", "--", container]


def on_every_host(spec: MultiNodeSpec, argv: list[str]) -> list[dict[str, Any]]:
    results = []
    for node in spec.nodes:
        res = run_on(spec, node, shlex.join(argv), warn=True)
        results.append({"host": node.host, "ok": res.exited == 0, "output": (res.stdout + res.stderr).strip()[-500:]})
    return results
