"""Installed package versions, as the manifest, the tuning log and the compile cache record them."""
from __future__ import annotations


def package_version(name: str, default: str = "unknown") -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return default


def nextn_version() -> str:
    return package_version("nextn", "0+unknown")
