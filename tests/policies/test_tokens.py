"""policies/tokens.py: the encodings the gateway counts with are lightened (tiktoken's Python copy of
the merge ranks dropped) and still encode and decode exactly as tiktoken's own."""
from __future__ import annotations

import pickle

import pytest
import tiktoken
import tiktoken.registry
from hypothesis import given, settings
from hypothesis import strategies as st
from tiktoken_ext.openai_public import cl100k_base, o200k_base

from policies.tokens import count_text, encoding, lighten_loaded

REFERENCES = {"o200k_base": o200k_base, "cl100k_base": cl100k_base}

_texts = st.one_of(
    st.text(max_size=400),
    st.lists(st.sampled_from(["def ", "return", " x", "<|endoftext|>", "<|fim_prefix|>", "\n", "  ", "é", "日本",
                              "0x1f", "src/main.rs", "Traceback", "🙂", "\u200b"]), max_size=80).map("".join),
)


@pytest.fixture(scope="module")
def references() -> dict[str, tiktoken.Encoding]:
    """Each encoding built afresh from its file, its ranks kept: what tiktoken itself would count."""
    return {name: tiktoken.Encoding(**constructor()) for name, constructor in REFERENCES.items()}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_the_encoding_counted_with_holds_no_python_copy_of_its_ranks(name: str) -> None:
    lightened = encoding(name)
    assert lightened._mergeable_ranks is None
    assert lightened is tiktoken.get_encoding(name)  # the one LiteLLM gets from tiktoken too
    copied = pickle.loads(pickle.dumps(lightened))  # a registered encoding is pickled by its name
    assert copied.encode("fn main() {}") == lightened.encode("fn main() {}")


def test_encodings_another_library_loaded_are_lightened_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM loads cl100k_base through tiktoken for its own counts: lighten_loaded drops its ranks too."""
    loaded_elsewhere = tiktoken.Encoding(**cl100k_base())
    monkeypatch.setitem(tiktoken.registry.ENCODINGS, "cl100k_base", loaded_elsewhere)
    assert loaded_elsewhere._mergeable_ranks is not None
    before = loaded_elsewhere.encode("def main():\n    return 0x1f  # é")
    assert "cl100k_base" in lighten_loaded()
    assert loaded_elsewhere._mergeable_ranks is None
    assert loaded_elsewhere.encode("def main():\n    return 0x1f  # é") == before


@settings(max_examples=150, deadline=None)
@given(text=_texts)
def test_a_lightened_encoding_encodes_and_decodes_as_tiktoken_does(references: dict[str, tiktoken.Encoding],
                                                                  text: str) -> None:
    for name, reference in references.items():
        tokens = encoding(name).encode(text, disallowed_special=())
        assert tokens == reference.encode(text, disallowed_special=())
        assert encoding(name).decode(tokens) == reference.decode(tokens)
        assert count_text(text, name) == len(tokens)
