"""The cost profiles the service prices updates with: the directory, checked once at
start-up, and the check of the profile each hello names (read at every hello, so a profile
added to the directory is found without a restart)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from aggregator.service.errors import SettingsError
from edge_agent.errors import ProfileError
from edge_agent.links.catalog import (
    PROFILES_DIR_ENV,
    default_profiles_dir,
    list_profiles,
    load_profile,
)

#: what a hello may name as its cost profile: a bare name (never a path on this machine)
_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_profiles_dir() -> Path:
    """The cost profiles directory the aggregator prices updates with
    (``CAT_EDGE_PROFILES_DIR``, else the shipped one), once checked: SettingsError naming
    the variable, the path and the fix when it does not exist, holds no profile, or holds
    an invalid one (every update would otherwise be priced as bytes only)."""
    directory = default_profiles_dir()
    if os.environ.get(PROFILES_DIR_ENV):
        where = f"{PROFILES_DIR_ENV}={directory}"
        fix = (
            f"set {PROFILES_DIR_ENV} to a directory of cost profiles (<name>.json, as the "
            "repository's cost_profiles/), or unset it to use the shipped ones"
        )
    else:
        where = f"the shipped cost profiles {directory} ({PROFILES_DIR_ENV} is unset)"
        fix = f"set {PROFILES_DIR_ENV} to a directory of cost profiles (<name>.json)"
    if not directory.is_dir():
        raise SettingsError(f"{where}: no such directory; {fix}")
    try:
        found = list_profiles(directory)
    except ProfileError as exc:
        raise SettingsError(f"{PROFILES_DIR_ENV}: {exc}") from None
    if not found:
        raise SettingsError(f"{where}: holds no cost profile (*.json); {fix}")
    return directory


def profile_problem(name: str) -> str | None:
    """None when the cost profile a hello names is in the profiles directory, else why not
    and the fix (the hello is refused ``unknown_profile``, never priced at zero). Read at
    each hello, so a profile added to the directory is found without a restart."""
    if not _PROFILE_NAME.fullmatch(name) or name.endswith(".json"):
        return f"{name[:64]!r} is not a cost profile name; run the agent with --profile <name>"
    directory = default_profiles_dir()
    path = directory / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in directory.glob("*.json")) if directory.is_dir() else []
        return (
            f"cost profile {name!r} is not in the aggregator's {directory} "
            f"({PROFILES_DIR_ENV}); add {name}.json there or run the agent with one of: "
            f"{', '.join(known) or 'none'}"
        )
    try:
        load_profile(path)
    except ProfileError as exc:
        return f"the aggregator cannot read its cost profile: {exc}"
    return None
