"""LiteLLM, and the only modules that import it: the client behind the upstream seam, the router, the direct
transport's preparation, Gemini's generateContent.

LiteLLM's offline environment is set here, when the package is first imported, so that it holds before
any of its modules imports LiteLLM, whichever comes first: the price map read from LiteLLM's own copy (no
download, which on a machine without internet waits ~30 s for three attempts), tokenizers from the folder
it ships, nothing fetched on its own account.
"""
import os

from gateway.upstream.encodings import use_bundled_encodings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
use_bundled_encodings()
