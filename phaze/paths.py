"""Where the checkout's files are: the repository root, which the config, its schema and the
architecture presets are found under. A module of its own so that both phaze.config and
phaze.arch.presets can take it without importing each other."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
