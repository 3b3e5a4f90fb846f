"""The pure core: vocabulary, transcript identity, token counting, policies.

Nothing here does I/O beyond reading tiktoken's bundled encodings; nothing here
imports `storage` or `gateway` (see DESIGN.md, "Layers").
"""
