"""The `runs` row: who ran what, where, with which versions."""

from __future__ import annotations

import json
import platform
import secrets
import socket
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata


def new_run_id() -> str:
    """`20261123T162250Z-123456ab12`: UTC start time, its microseconds, a random suffix; so run
    ids sort by start time even for runs started within one second (history orders by id)."""
    now = datetime.now(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + f"-{now.microsecond:06d}" + secrets.token_hex(2)


def started_from_id(run_id: str) -> datetime:
    """A run's start time read off its id (to the second), for rows whose `runs` row is missing;
    the epoch for an id not made by `new_run_id`."""
    try:
        return datetime.strptime(run_id[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return datetime.fromtimestamp(0, timezone.utc)


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def nvcc_version() -> str:
    """`nvcc --version`'s release line ("13.0, V13.0.88"), or "" without nvcc on PATH."""
    try:
        text = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=10,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    release = [line for line in text.splitlines() if "release" in line]
    return release[-1].split("release", 1)[1].strip() if release else ""


def package_versions() -> dict[str, str]:
    """Packages and toolchain: a compiler change is a common cause of a "regression"."""
    out = {"python": platform.python_version(), "python_compiler": platform.python_compiler()}
    nvcc = nvcc_version()
    if nvcc:
        out["nvcc"] = nvcc
    for name in ("numpy", "ml_dtypes", "pyarrow", "torch", "cupy", "cupy-cuda12x",
                 "cupy-cuda13x", "mlx", "triton", "kparity"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def run_row(run_id: str, verb: str, devices: dict, versions: dict, filters: dict) -> dict:
    return {
        "run_id": run_id,
        "started": datetime.now(timezone.utc),
        "command": " ".join(["kparity", *sys.argv[1:]]),
        "verb": verb,
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "devices": json.dumps(devices, sort_keys=True),
        "versions": json.dumps({**package_versions(), **versions}, sort_keys=True),
        "filters": json.dumps(filters, sort_keys=True, default=str),
    }
