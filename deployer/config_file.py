"""Reading cluster.yaml: the YAML mapping only, no validation (that is spec.py's).

Apart from spec.py so verbs that only need the file's `name:` (status, ssh) do not
build the spec models at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import UsageError

CONFIG_FILE = "cluster.yaml"


def read_config(path: Path | None) -> tuple[dict[str, Any], str]:
    """The YAML mapping from `path` (or ./cluster.yaml when present) and its display name."""
    if path is None:
        default = Path(CONFIG_FILE)
        if not default.exists():
            return {}, "flags"
        path = default
    if not path.exists():
        raise UsageError(f"{path}: no such file; create one with `deployer init` or drop --config")
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UsageError(f"{path}:{where}: not valid YAML; fix the syntax ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of keys (name:, nodes:, ...); see `deployer init`")
    return data, str(path)
