"""The CLI config file (`$CORRAL_HOME/config.yaml`, mode 0600: url + token) that the server
writes for the bootstrapped admin; CORRAL_URL / CORRAL_TOKEN override it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from corral.config import default_home
from corral.sdk.errors import CorralError
from corral.yaml_lines import safe_load

DEFAULT_URL = "http://127.0.0.1:8080"
CONFIG_FILE = "config.yaml"


@dataclass(frozen=True)
class ClientConfig:
    url: str = DEFAULT_URL
    token: str | None = None


def config_path(home: Path | None = None) -> Path:
    return (home or default_home()) / CONFIG_FILE


def write_cli_config(url: str, token: str, home: Path | None = None) -> Path:
    """Write url + token to `$CORRAL_HOME/config.yaml`, readable by its owner only (0600)."""
    path = config_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Create with 0600 from the start so the token is never briefly world-readable.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump({"url": url, "token": token}, fh)
    os.chmod(path, 0o600)
    return path


def load_cli_config(home: Path | None = None, env: Mapping[str, str] | None = None) -> ClientConfig:
    """The config file, overridden by CORRAL_URL / CORRAL_TOKEN from the environment."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    path = config_path(home)
    if path.exists():
        try:
            loaded = safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise CorralError(f"{path} is not valid YAML (write `url:` and `token:` lines): {exc}")
        if isinstance(loaded, dict):
            data = loaded
    url = env.get("CORRAL_URL") or data.get("url") or DEFAULT_URL
    token = env.get("CORRAL_TOKEN") or data.get("token")
    return ClientConfig(url=str(url).rstrip("/"), token=str(token) if token else None)
