"""tiktoken's encodings, offline: from the folder LiteLLM ships (cl100k_base, o200k_base).

tiktoken downloads its encodings unless TIKTOKEN_CACHE_DIR points at a folder that
holds them, and LiteLLM resets that variable on first use unless
CUSTOM_TIKTOKEN_CACHE_DIR is set too. Every entry point (the CLI, the app, tests and
benchmarks) calls `use_bundled_encodings()` before it counts a token; `policies/`
only asks tiktoken for an encoding. The folder is found without importing LiteLLM,
which is slow.
"""
from __future__ import annotations

import importlib.util
import os


def bundled_tiktoken_dir() -> str | None:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "litellm_core_utils", "tokenizers")


def use_bundled_encodings() -> None:
    """Point tiktoken (and LiteLLM, which resets the variable) at the bundled files."""
    folder = bundled_tiktoken_dir()
    if folder is None:
        return
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", folder)
    os.environ.setdefault("CUSTOM_TIKTOKEN_CACHE_DIR", os.environ["TIKTOKEN_CACHE_DIR"])
