"""How long a cluster lives: the TTL, the expiry it sets, and what has expired.

A forgotten cluster of GPU VMs burns a project's allocation, so `up --ttl 8h` (or
`ttl: 8h` in the spec) records an expiry: in the state dir (lifetime.json) and, on
OpenStack, in every server's and the volume's metadata (`deployer_expires_at`), which
survives the loss of this machine's state and is the record that decides there: a change
is written to it first (lifecycle._set_lifetime), and the cluster has expired only when
every one of them says so. `deployer gc` destroys what has expired; `status` shows the time left.

The expiry is set when the cluster is made, when --ttl is given again (extending or
shortening it from now), or when the spec's ttl changes; a plain re-run keeps it.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from .errors import UsageError
from .records import Lifetime

UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^(\d+)(m|h|d|w)$")
NO_TTL = ("none", "never")
MAX_ENV = "DEPLOYER_TTL_MAX"
DEFAULT_MAX = "14d"


def parse_duration(text: str) -> int:
    """'30m', '8h', '2d', '1w' -> seconds; ValueError naming the form otherwise."""
    m = _DURATION.match(str(text).strip().lower())
    if not m:
        raise ValueError(f"must be a duration like 30m, 8h, 2d or 1w (or none), not {text!r}")
    seconds = int(m.group(1)) * UNITS[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"{text} is no lifetime; give a positive duration like 8h, or none for no expiry")
    return seconds


def max_ttl() -> tuple[str, int]:
    """The longest TTL allowed: $DEPLOYER_TTL_MAX (an operator's setting), else 14d."""
    text = os.environ.get(MAX_ENV, DEFAULT_MAX)
    try:
        return text, parse_duration(text)
    except ValueError as e:
        raise UsageError(f"${MAX_ENV}: {e}") from None


def normalise_ttl(value: Any) -> str | None:
    """The spec's ttl: None for no expiry, else a duration within the maximum."""
    if value is None or (isinstance(value, str) and value.strip().lower() in NO_TTL):
        return None
    text = str(value).strip().lower()
    seconds = parse_duration(text)
    limit_text, limit = max_ttl()
    if seconds > limit:
        raise ValueError(f"{text} is beyond the maximum of {limit_text} (${MAX_ENV} sets it)")
    return text


def now() -> datetime:
    return datetime.now(UTC)


def iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def next_record(ttl: str | None, current: Lifetime | None, *, ttl_given: bool, at: datetime) -> Lifetime | None:
    """The lifetime record after this `up`: None (no expiry), the current one (a plain
    re-run), or a new expiry `ttl` from `at` (a new cluster, --ttl given, ttl changed)."""
    if ttl is None:
        return None
    if current and not ttl_given and current.ttl == ttl:
        return current
    return Lifetime(ttl=ttl, set_at=iso(at), expires_at=iso(at + timedelta(seconds=parse_duration(ttl))))


def seconds_left(record: Lifetime | None, at: datetime) -> float | None:
    if record is None:
        return None
    return (parse_iso(record.expires_at) - at).total_seconds()


def human(seconds: float) -> str:
    """3h 05m, 2d 4h, 45s: the two largest units."""
    s = int(abs(seconds))
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d}d {h}h"
    if h:
        return f"{h}h {m:02d}m"
    if m:
        return f"{m}m {sec:02d}s"
    return f"{sec}s"


def describe_left(record: Lifetime | None, at: datetime) -> str | None:
    if record is None:
        return None
    left, when = seconds_left(record, at) or 0.0, record.expires_at
    return f"expires in {human(left)} ({when})" if left > 0 else f"expired {human(left)} ago ({when}): `deployer gc --yes` removes it"
