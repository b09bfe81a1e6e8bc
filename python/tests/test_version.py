"""The package version is the one written in include/kvsift/version.hpp (the single source)."""

from __future__ import annotations

import pathlib
import re

import kvsift

HEADER = pathlib.Path(__file__).resolve().parents[2] / "include" / "kvsift" / "version.hpp"


def header_version() -> str:
    text = HEADER.read_text()
    parts = [re.search(rf"^#define KVSIFT_VERSION_{p} +([0-9]+) *$", text, re.M).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def test_version_is_the_headers():
    assert kvsift.__version__ == header_version()
    assert kvsift.header_version() == header_version()  # what the compiled library was built from
