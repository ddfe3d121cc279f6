"""Cost profile files: where the shipped ones live, reading and writing one, finding one by
name or path (``edge-agent run --profile <name or file>``).

:mod:`edge_agent.links.profiles` is the model and its validation from a mapping; this
module is all of the file system it needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Final

from edge_agent.errors import ProfileError
from edge_agent.links.profiles import CostProfile, parse_profile, profile_to_json

__all__ = [
    "PROFILES_DIR_ENV",
    "default_profiles_dir",
    "list_profiles",
    "load_profile",
    "resolve_profile",
    "save_profile",
]

#: the environment variable naming a directory of cost profiles (else the shipped ones)
PROFILES_DIR_ENV: Final = "CAT_EDGE_PROFILES_DIR"


def load_profile(path: str | Path) -> CostProfile:
    """Read and validate one profile JSON file; a bare name (a ``str`` without ``.json`` or
    a path separator, e.g. ``"lorawan_eu868_dr5_sf7"``) is a shipped profile, as in
    :func:`resolve_profile`.

    Raises ProfileError naming the file, the field and what is allowed, for a missing
    or unreadable file, invalid JSON, or an invalid profile.
    """
    if isinstance(path, str) and not _looks_like_path(path):
        return resolve_profile(path)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"profile {path}: file not found{_shipped_hint(path)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"profile {path}: cannot read the file: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"profile {path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    return parse_profile(data, str(path))


def save_profile(profile: CostProfile, path: str | Path) -> Path:
    """Write ``profile`` as JSON to ``path`` (atomically: temp file, then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(profile_to_json(profile), encoding="utf-8")
    tmp.replace(path)
    return path


def default_profiles_dir() -> Path:
    """The shipped profiles: ``$CAT_EDGE_PROFILES_DIR`` when set, else the repository's
    ``cost_profiles/`` (a checkout or editable install), else the copy a regular install puts
    in ``<prefix>/share/cat-edge/cost_profiles`` (the environment's prefix, or the user
    scheme's for ``pip install --user``). When none exists: the environment's, so an error
    names where the profiles were expected."""
    override = os.environ.get(PROFILES_DIR_ENV)
    if override:
        return Path(override)
    checkout = Path(__file__).resolve().parents[2] / "cost_profiles"
    if checkout.is_dir():
        return checkout
    candidates = [Path(sys.prefix), Path(sysconfig.get_path("data"))]
    with contextlib.suppress(KeyError):  # no user scheme on this platform
        candidates.append(Path(sysconfig.get_path("data", f"{os.name}_user")))
    for prefix in candidates:
        shipped = prefix / "share" / "cat-edge" / "cost_profiles"
        if shipped.is_dir():
            return shipped
    return Path(sys.prefix) / "share" / "cat-edge" / "cost_profiles"


def list_profiles(directory: Path | None = None) -> list[CostProfile]:
    """Load every ``*.json`` profile in ``directory`` (default: ``default_profiles_dir()``).

    Sorted by name. Raises ProfileError for an invalid file, a missing directory, or
    two files that define the same name.
    """
    directory = default_profiles_dir() if directory is None else Path(directory)
    if not directory.is_dir():
        raise ProfileError(f"profiles directory {directory} does not exist")
    seen: dict[str, Path] = {}
    profiles: list[CostProfile] = []
    for path in sorted(directory.glob("*.json")):
        profile = load_profile(path)
        if profile.name in seen:
            raise ProfileError(
                f"profile {path}: name: {profile.name!r} is already defined by {seen[profile.name]}"
            )
        seen[profile.name] = path
        profiles.append(profile)
    return sorted(profiles, key=lambda p: p.name)


def resolve_profile(name_or_path: str) -> CostProfile:
    """A profile from a path to a JSON file, or a bare name looked up in default_profiles_dir().

    A string that ends in ``.json`` or contains a path separator is a path; anything
    else is a name (file ``<name>.json``). Raises ProfileError listing the known names
    when a name is not found.
    """
    if _looks_like_path(name_or_path):
        return load_profile(Path(name_or_path))
    directory = default_profiles_dir()
    path = directory / f"{name_or_path}.json"
    if not path.is_file():
        known = sorted(p.stem for p in directory.glob("*.json")) if directory.is_dir() else []
        raise ProfileError(
            f"unknown cost profile {name_or_path!r} in {directory}; "
            f"known profiles: {', '.join(known) or 'none'}"
        )
    return load_profile(path)


def _looks_like_path(name_or_path: str) -> bool:
    """A string ending in ``.json`` or holding a path separator names a file, else a profile."""
    return name_or_path.endswith(".json") or any(
        sep in name_or_path for sep in {"/", os.sep, os.altsep or "/"}
    )


def _shipped_hint(path: Path) -> str:
    """``; the shipped profile <stem> is found by its bare name ...`` when ``path`` is missing
    but a shipped profile has its file name (e.g. ``cost_profiles/x.json`` outside the
    repository), else ``""``."""
    directory = default_profiles_dir()
    if path.suffix == ".json" and (directory / path.name).is_file():
        return (
            f"; the shipped profile {path.stem!r} ({directory / path.name}) is found from "
            f"anywhere by its bare name: --profile {path.stem}"
        )
    return ""
