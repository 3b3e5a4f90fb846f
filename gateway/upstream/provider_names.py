"""The provider prefixes LiteLLM routes (`litellm.provider_list` of the pinned LiteLLM), without importing it.

`litellm_params.model: opnai/gpt-4o` loads, serves, and fails every request with LiteLLM"s message;
the config refuses it instead, naming the provider it was probably meant to be. The list is LiteLLM"s
own, copied so the config is checked without LiteLLM"s slow import; tests/gateway/upstream/test_deployments.py
compares it with the installed LiteLLM"s, so an upgrade that adds a provider fails there first.
"""
from __future__ import annotations

import difflib

PROVIDERS = frozenset(
    {
        "a2a", "a2a_agent", "abliteration", "ai21", "ai21_chat", "aiand", "aiml", "aiohttp_openai",
        "amazon_nova", "anthropic", "anthropic_text", "apertis", "assemblyai", "auto_router", "aws_polly",
        "aws_textract", "azure", "azure_ai", "azure_speech", "azure_text", "baseten", "bedrock",
        "bedrock_mantle", "bespoke", "bigmodel", "black_forest_labs", "bytez", "cerebras", "charity_engine",
        "chatgpt", "chutes", "clarifai", "clf_ai_gateway", "cloudflare", "codestral", "cognition", "cohere",
        "cohere_chat", "cometapi", "compactifai", "coralbricks", "cortecs", "cursor", "custom", "custom_openai",
        "darkbloom", "dashscope", "databricks", "databricks_agent", "datarobot", "deepgram", "deepinfra",
        "deepseek", "docker_model_runner", "dotprompt", "edenai", "elevenlabs", "empiriolabs", "empower",
        "eu_jev", "fal_ai", "featherless_ai", "fireworks_ai", "friendliai", "galadriel", "gdc", "gemini",
        "gigachat", "github", "github_copilot", "gradient_ai", "groq", "helicone", "heroku", "hosted_vllm",
        "hostinger_router", "huggingface", "humanloop", "hyperbolic", "inception", "inferenceapis", "infinity",
        "jina_ai", "kyma", "lambda_ai", "langflow", "langfuse", "langgraph", "laya", "lemonade", "libertai",
        "litellm_agent", "litellm_proxy", "llamafile", "lm_studio", "manus", "maritalk", "meta", "meta_llama",
        "microsoft_365_copilot", "milvus", "minimax", "mistral", "modelscope", "mongodb", "moonshot", "morph",
        "nace", "nadir", "nano-gpt", "nebius", "neosantara", "nlp_cloud", "novita", "nscale", "nvidia_nim",
        "nvidia_riva", "oci", "ollama", "ollama_chat", "oobabooga", "openai", "openai_like", "opencode_go",
        "openinfer", "openrouter", "opensearch", "ovhcloud", "parallel_ai", "parasail", "perplexity", "petals",
        "pg_vector", "pinstripes", "poe", "predibase", "prism", "publicai", "qwen_ai_platform", "qwencloud",
        "ragflow", "recraft", "reducto", "refuseless", "reka", "replicate", "runwayml", "s3_vectors",
        "sagemaker", "sagemaker_chat", "sagemaker_nova", "sail", "sambanova", "sap", "scaledown", "scaleway",
        "scx-ai", "snowflake", "soniox", "stability", "strands_decider", "streamlake", "synthetic", "tencent",
        "tensormesh", "text-completion-codestral", "text-completion-inception", "text-completion-openai",
        "together_ai", "topaz", "transcribe", "triton", "typesafe", "v0", "valkey", "vercel_ai_gateway",
        "vertex_ai", "vertex_ai_beta", "vllm", "volcengine", "voyage", "wally", "wandb", "watsonx",
        "watsonx_text", "xai", "xiaomi_mimo", "xinference", "zai", "zerogpu"
    }
)


def provider_problem(model: str, custom_llm_provider: object = None) -> str | None:
    """Why `litellm_params.model` names no provider LiteLLM knows, or None. A model without a `provider/`
    prefix (LiteLLM infers OpenAI"s and a few others), or with `custom_llm_provider` set, is not checked."""
    if custom_llm_provider is not None or "/" not in model:
        return None
    prefix = model.split("/", 1)[0]
    if prefix in PROVIDERS:
        return None
    close = difflib.get_close_matches(prefix, sorted(PROVIDERS), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"litellm_params.model: {prefix!r} is not a provider LiteLLM knows{hint}"
