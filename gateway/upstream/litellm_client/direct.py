"""LiteLLM's side of the direct transport (gateway/upstream/direct_chat.py): which deployments qualify, the
exact request LiteLLM would send, and how answers and failures read (issue 11).

Everything here calls LiteLLM's own functions in the order `litellm.completion` applies them, so a
request and its answer are the same through either transport; `tests/gateway/upstream/test_direct_chat.py`
compares the two byte for byte. `GATEWAY_DIRECT_TRANSPORT=0` (or `server.direct_transport: false`)
turns the transport off.
"""
from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import httpx
import openai
from litellm import main as litellm_main
from litellm.litellm_core_utils.core_helpers import map_finish_reason
from litellm.litellm_core_utils.exception_mapping_utils import exception_type
from litellm.litellm_core_utils.llm_response_utils.convert_dict_to_response import convert_to_model_response_object
from litellm.llms.openai.chat.gpt_transformation import OpenAIGPTConfig, OpenAIUnknownModelConfig, _prompt_cache_options
from litellm.llms.openai.common_utils import BaseOpenAILLM, OpenAIError, upstream_error_response

from gateway.errors import UpstreamError
from gateway.upstream.direct_chat import DirectCall, EndedWithoutFinish, ErrorEvent, Repetition
from gateway.upstream.litellm_client.base import PRICING_KEYS, litellm, map_error
from gateway.upstream.litellm_client.chat_preparation import MessageMemo, Prepared, message_steps
from policies.memo import memo

# litellm_params a direct deployment may hold: anything else is something LiteLLM would act on.
_DIRECT_KEYS = frozenset({"model", "api_base", "api_key", "extra_headers", "timeout"}) | PRICING_KEYS
# The chat configs whose transformation is the plain OpenAI one (o-series, gpt-5, audio, OpenAI-like
# providers rewrite params or messages on their own).
_DIRECT_CONFIGS = (OpenAIGPTConfig, OpenAIUnknownModelConfig)
_COMPLETION_ARGS = frozenset(inspect.signature(litellm_main.completion).parameters)
_SDK_OPTIONS = ("extra_headers", "extra_query", "extra_body")


def direct_wanted() -> bool:
    return os.environ.get("GATEWAY_DIRECT_TRANSPORT", "1").strip().lower() not in ("0", "false", "no", "off")


def _litellm_acts_globally() -> bool:
    """Module settings or environment under which LiteLLM would change an OpenAI request on its own."""
    return bool(
        litellm.api_base or litellm.headers or litellm.proxy_auth or litellm.model_alias_map
        or litellm.model_fallbacks or litellm.drop_params or litellm.modify_params or litellm.cache
        or litellm.enable_preview_features or litellm.enable_anthropic_prompt_caching
        or litellm.add_function_to_prompt or litellm.openai_system_messages_first or litellm.organization
        or litellm.route_all_chat_openai_to_responses or litellm.aclient_session or litellm.callbacks
        or litellm.OpenAIConfig.get_config()
        or any(os.environ.get(name) for name in ("OPENAI_ORGANIZATION", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID",
                                                  "EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER")))


@dataclass(frozen=True)
class _DirectRoute:
    """What LiteLLM resolved for a deployment that qualifies for the direct transport."""

    model: str  # as the provider knows it
    provider: str
    api_base: str
    api_key: str
    url: str
    config: Any  # the OpenAI chat config LiteLLM uses for the model


def direct_route(litellm_params: Mapping[str, Any]) -> _DirectRoute | None:
    """The direct route of a deployment, or None when LiteLLM must make the call itself."""
    if not _DIRECT_KEYS.issuperset(litellm_params):
        return None
    api_base, api_key = litellm_params.get("api_base"), litellm_params.get("api_key")
    extra_headers = litellm_params.get("extra_headers") or {}
    if not (isinstance(api_base, str) and api_base and isinstance(api_key, str) and api_key
            and isinstance(extra_headers, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in extra_headers.items())):
        return None
    if _litellm_acts_globally():
        return None
    return _resolve_direct_route(str(litellm_params["model"]), api_base, api_key)


@memo(maxsize=256)
def _resolve_direct_route(model: str, api_base: str, api_key: str) -> _DirectRoute | None:
    try:
        name, provider, _key, base = litellm.get_llm_provider(model, api_base=api_base, api_key=api_key)
        if provider not in ("openai", "custom_openai"):
            return None
        config = litellm.ProviderConfigManager.get_provider_chat_config(
            model=name, provider=litellm.LlmProviders(provider))
        if type(config) not in _DIRECT_CONFIGS:
            return None
        base = base or api_base
        mode, bridged = litellm_main.responses_api_bridge_check(
            model=name, custom_llm_provider=provider, api_base=base, deployment_model_info={})
        if mode.get("mode") == "responses" or bridged != name:
            return None
        if litellm_main.get_provider_affinity_header(base) is not None:
            return None
    except Exception:  # whatever LiteLLM cannot resolve, it reports itself on its own path
        return None
    return _DirectRoute(model=name, provider=provider, api_base=base, api_key=api_key,
                        url=f"{base.rstrip('/')}/chat/completions", config=config)


def openai_request(route: _DirectRoute, kwargs: Mapping[str, Any], stream: bool, memo: MessageMemo | None = None,
                   digests: Sequence[bytes | None] | None = None) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The body and extra headers LiteLLM would send for one `litellm.acompletion(**kwargs)` call to an
    OpenAI deployment, built by LiteLLM's own functions in the order `litellm.completion` and its OpenAI
    handler apply them; None where that call would take a route of its own (MCP tools, the Responses
    bridge, several streamed choices). With a `memo`, messages it has prepared for the route before are
    taken from it (gateway/upstream/litellm_client/chat_preparation.py), those with a `digests` entry known by it (the exact
    JSON text's digest); without, every message is prepared again."""
    named = {k: v for k, v in kwargs.items() if k in _COMPLETION_ARGS}
    unnamed = {k: v for k, v in kwargs.items() if k not in _COMPLETION_ARGS}
    tools = litellm_main.validate_and_fix_openai_tools(tools=named.get("tools"))
    if (tools and litellm_main.may_name_litellm_mcp_gateway(tools)) or (stream and (named.get("n") or 1) > 1):
        return None
    if not _stays_on_chat(route, named.get("web_search_options")):
        return None
    given = named.get("messages") or []
    prepared = memo.lookup(route, given, _litellm_params(route), digests) if memo is not None else None
    messages = message_steps(route, given) if prepared is None else prepared.messages
    named["tools"] = _checked_params(route, kwargs["model"], named, tools)
    optional_params, effort = _optional_params(route, named, unnamed, messages, memo)
    if prepared is None:  # else no message has a PDF part, and the check below changes nothing
        readable = litellm_main._messages_readable_by_model(
            messages=messages, model=route.model, custom_llm_provider=route.provider, model_info=None,
            base_model=None, drop_params=False, ensure_alternating_roles=None, user_continue_message=None,
            assistant_continue_message=None)
        if readable is not None:
            messages = list(readable)
    if not _stays_on_chat(route, named.get("web_search_options"), named["tools"], effort, optional_params, memo):
        return None
    return _wire_body(route, messages, optional_params, dict(kwargs.get("extra_headers") or {}), stream, prepared)


def _stays_on_chat(route: _DirectRoute, web_search_options: Any, tools: Any = None, effort: Any = None,
                   optional_params: Mapping[str, Any] | None = None, memo: MessageMemo | None = None) -> bool:
    """Whether LiteLLM keeps the call on chat completions (it bridges some to the Responses API)."""
    bridge = {} if optional_params is None else {
        "tools": tools, "reasoning_summary": litellm_main.peek_reasoning_summary_aliases(optional_params),
        "reasoning_effort": litellm_main.bridge_reasoning_effort(effort, optional_params.get("extra_body"))}
    if web_search_options is None and not any(value is not None for value in bridge.values()):
        return True  # the deployment's own check (`_resolve_direct_route`) asked exactly this
    arguments = dict(model=route.model, custom_llm_provider=route.provider, web_search_options=web_search_options,
                     api_base=route.api_base, deployment_model_info={}, **bridge)

    def check() -> Any:
        return litellm_main.responses_api_bridge_check(**arguments)

    mode, _ = check() if memo is None else memo.remembered("responses_api_bridge_check", arguments, check)
    return mode.get("mode") != "responses"


def _checked_params(route: _DirectRoute, model: str, named: dict[str, Any], tools: Any) -> Any:
    """The tools as `litellm.completion` prepares them before mapping params; it also validates
    `tool_choice`, `stop` and `thinking`, which `_optional_params` reads back from `named`. (It does so
    after validating the messages and before their other steps, `message_steps`: a request both refuse
    fails either way, and the caller's message dicts are fixed before either refuses.)"""
    m = litellm_main
    named["tool_choice"] = m.validate_chat_completion_tool_choice(tool_choice=named.get("tool_choice"), model=model)
    named["stop"] = m.validate_openai_optional_params(stop=named.get("stop"))
    named["thinking"] = m.validate_and_fix_thinking_param(thinking=named.get("thinking"))
    tools = m._drop_anthropic_only_tool_keys(tools=tools)
    for check in (m.raise_if_allowed_tools_tool_choice_unsupported, m.raise_if_hosted_tool_choice_unsupported):
        check(tool_choice=named["tool_choice"], custom_llm_provider=route.provider, model=route.model)
    return tools


def _litellm_params(route: _DirectRoute) -> dict[str, Any]:
    """The litellm_params LiteLLM's OpenAI handler gives `transform_request`."""
    return {"custom_llm_provider": route.provider, "api_base": route.api_base}


_OPTIONAL_PARAM_ARGS = (
    "functions", "function_call", "temperature", "top_p", "n", "stream", "stream_options", "stop", "max_tokens",
    "max_completion_tokens", "modalities", "prediction", "audio", "presence_penalty", "frequency_penalty",
    "logit_bias", "user", "response_format", "seed", "tools", "tool_choice", "logprobs", "top_logprobs",
    "api_version", "parallel_tool_calls", "verbosity", "web_search_options", "include_server_side_tool_invocations",
    "safety_identifier", "service_tier", "store", "prompt_cache_key", "prompt_cache_retention",
)


def _optional_params(route: _DirectRoute, named: Mapping[str, Any], unnamed: Mapping[str, Any], messages: list[Any],
                     memo: MessageMemo | None = None) -> tuple[dict[str, Any], Any]:
    """`get_optional_params` as `litellm.completion` calls it (remembered in `memo`), and the reasoning
    effort it resolved."""
    m, model, provider, config = litellm_main, route.model, route.provider, route.config
    non_default = m.get_non_default_completion_params(kwargs=unnamed)
    requested_output = m.as_str_mapping(non_default.get("output_config"))
    reasoning = m.resolve_chat_reasoning(named.get("reasoning_effort"), named.get("thinking"), requested_output,
                                         model=model, custom_llm_provider=provider, deployment_model_info=None,
                                         model_group=None, drop_params=False)
    provider_params = non_default if reasoning.output_config is requested_output else {
        **{k: v for k, v in non_default.items() if k != "output_config"},
        **({"output_config": reasoning.output_config} if reasoning.output_config is not None else {})}
    allowed = ["reasoning_effort"] if m.reasoning_effort_needs_allowing(
        reasoning.effort, model=model, custom_llm_provider=provider, base_model=None) else None
    effort = m.reasoning_effort_with_summary_alias(
        reasoning.effort.value, provider_params, accepts_summary=config.accepts_reasoning_summary_in_reasoning_effort)
    arguments = dict(**{arg: named.get(arg) for arg in _OPTIONAL_PARAM_ARGS}, model=model, custom_llm_provider=provider,
                     max_retries=unnamed.get("max_retries"), reasoning_effort=effort, thinking=reasoning.thinking,
                     allowed_openai_params=allowed, base_model=None, model_info=None, **provider_params)

    def optional_params() -> dict[str, Any]:
        return m.get_optional_params(**arguments, messages=messages)

    # For the OpenAI configs it leaves `messages` out of the params (a test changes them under the memo).
    return (optional_params() if memo is None else memo.remembered("get_optional_params", arguments, optional_params),
            reasoning.effort.value)


def _wire_body(route: _DirectRoute, messages: list[Any], optional_params: Mapping[str, Any],
               headers: dict[str, str], stream: bool,
               prepared: Prepared | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """What LiteLLM's OpenAI handler and the openai SDK make of the prepared call: the config's
    `transform_request` (on the new messages only, with `prepared`), stream options, then `extra_body`
    merged into the body."""
    outbound = litellm_main.with_attribution_headers(route.config.get_attribution_headers(), headers) or {}
    params = {k: v for k, v in optional_params.items() if k not in ("stream", "stream_options", "max_retries")}
    if outbound:
        params["extra_headers"] = outbound

    def transform(some: list[Any]) -> dict[str, Any]:
        return route.config.transform_request(model=route.model, messages=some, optional_params=dict(params),
                                              litellm_params=_litellm_params(route), headers=outbound)

    data = prepared.body(transform, _prompt_cache_options(params)) if prepared is not None else None
    if data is None:
        data = transform(messages)
    if stream:
        data["stream"] = True
        if optional_params.get("stream_options") is not None:
            data["stream_options"] = optional_params["stream_options"]
    body = {k: v for k, v in data.items() if k not in _SDK_OPTIONS}
    body.update(data.get("extra_body") or {})
    return body, dict(data.get("extra_headers") or {})


_SDK_STATUS_ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError, 401: openai.AuthenticationError, 403: openai.PermissionDeniedError,
    404: openai.NotFoundError, 409: openai.ConflictError, 422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}


def _sdk_status_error(response: httpx.Response) -> openai.APIStatusError:
    """The openai SDK's exception for an error status (`_make_status_error_from_response`)."""
    message = f"Error code: {response.status_code}"
    body: Any = response.text.strip()
    try:
        body = json.loads(body)
    except ValueError:
        pass
    else:
        error = body.get("error", body) if isinstance(body, Mapping) else None
        detail = error.get("message") if isinstance(error, Mapping) else None
        if isinstance(detail, str) and detail:
            message += f" - {detail}"
    data = body.get("error", body) if isinstance(body, Mapping) else body
    kind = _SDK_STATUS_ERRORS.get(response.status_code) or (
        openai.InternalServerError if response.status_code >= 500 else openai.APIStatusError)
    return kind(message, response=response, body=data)


def _with_context(error: BaseException, context: BaseException | None) -> BaseException:
    if error.__cause__ is None and error.__context__ is None:
        error.__context__ = context
    return error


def _litellm_exception(original: Exception, model: str) -> Exception:
    """The exception `litellm.exception_type` makes of a provider failure."""
    try:
        exception_type(model=model, original_exception=original, custom_llm_provider="openai")
    except Exception as mapped:  # it raises the mapped exception
        return mapped
    return original


def _openai_error(error: Exception) -> OpenAIError:
    """What LiteLLM's OpenAI handler wraps any failure of the SDK call in."""
    response = getattr(error, "response", None)
    headers = getattr(error, "headers", None)
    if headers is None and response is not None:
        headers = getattr(response, "headers", None)
    wrapped = OpenAIError(status_code=getattr(error, "status_code", 500), message=getattr(error, "message", str(error)),
                          response=upstream_error_response(error), headers=headers, body=getattr(error, "body", None))
    wrapped.__context__ = error
    return wrapped


def openai_http_client() -> httpx.AsyncClient:
    """The HTTP client LiteLLM's OpenAI handler gives the openai SDK: `litellm.aclient_session` when set,
    else an httpx client over LiteLLM's aiohttp transport (or over httpx's own when LiteLLM is told
    not to use aiohttp), with its SSL and proxy settings. The direct transport posts through it, so
    both paths reach a deployment over the same stack."""
    client = BaseOpenAILLM._get_async_http_client()
    assert client is not None  # None only for a sync-only configuration LiteLLM does not make here
    return client


class OpenAIDirectCodec:
    """LiteLLM's reading of a direct exchange: answers through its own response conversion, failures
    through the exceptions its OpenAI handler, the openai SDK and its stream wrapper would raise."""

    repetition_limit = litellm.REPEATED_STREAMING_CHUNK_LIMIT

    def completion(self, response: httpx.Response, call: DirectCall) -> dict[str, Any]:
        headers = dict(response.headers)
        try:
            parsed = self._sdk_parse(response)
            try:
                answer = self._converted(parsed, headers)
            except Exception:  # its message quotes the dict: word it on the SDK's key order, as LiteLLM does
                answer = self._converted(_sdk_ordered(parsed), headers)
        except Exception as exc:
            raise self._mapped(_openai_error(exc), call)
        return answer.model_dump()

    @staticmethod
    def _converted(parsed: dict[str, Any], headers: dict[str, str]) -> Any:
        return convert_to_model_response_object(
            response_object=OpenAIGPTConfig().transform_parsed_response_dict(parsed),
            model_response_object=_empty_model_response(), hidden_params={"headers": headers},
            _response_headers=headers)

    @staticmethod
    def _sdk_parse(response: httpx.Response) -> dict[str, Any]:
        """The body as LiteLLM gets it from the openai SDK: the JSON object (under another content type,
        the text when it is no JSON). The SDK's unvalidated model round trip changes only key order."""
        content_type = response.headers.get("content-type", "*").split(";")[0]
        try:
            data: Any = response.json()
        except ValueError:
            if content_type.endswith("json"):
                raise
            data = response.text
        if not isinstance(data, dict):
            raise OpenAIError(status_code=500, message=(
                f"Empty or invalid response from LLM endpoint. Received: {data!r}. "
                "Check the reverse proxy or model server configuration."))
        return data

    @staticmethod
    def _mapped(error: Exception, call: DirectCall) -> UpstreamError:
        mapped = _litellm_exception(error, str(call.request.litellm_params["model"]))
        upstream = map_error(_with_context(mapped, error), call.request)
        upstream.__cause__ = mapped
        return upstream

    def status_error(self, response: httpx.Response, call: DirectCall) -> Exception:
        return self._mapped(_openai_error(_sdk_status_error(response)), call)

    def transport_error(self, error: Exception, call: DirectCall, elapsed: float, stream: bool) -> Exception:
        request = _request_of(error, call)
        if isinstance(error, httpx.TimeoutException):
            sdk_error: openai.APIConnectionError = openai.APITimeoutError(request=request)
            if not stream:
                sdk_error.message += f" - timeout value={call.timeout}, time taken={round(elapsed, 2)} seconds"
        else:
            sdk_error = openai.APIConnectionError(request=request)
        sdk_error.__cause__ = error
        wrapped = OpenAIError(status_code=500, message=str(sdk_error) if stream else sdk_error.message)
        wrapped.__context__ = sdk_error
        return self._mapped(wrapped, call)

    def stream_error(self, error: Exception, call: DirectCall, generated: str, started: bool) -> Exception:
        raw, handling = self._stream_failure(error, call)
        if isinstance(raw, OpenAIError):
            mapped: Exception = raw
        else:
            mapped = _litellm_exception(raw, call.model)
        statuses = (getattr(mapped, "status_code", None), getattr(raw, "status_code", None))
        timed_out = isinstance(raw, httpx.TimeoutException)
        if not timed_out and any(isinstance(s, int) and 400 <= s < 500 and s != 429 for s in statuses):
            final = mapped
        else:
            final = litellm.exceptions.MidStreamFallbackError(
                message=str(mapped), model=call.model, llm_provider="openai", original_exception=mapped,
                generated_content=generated, is_pre_first_chunk=not started)
        final.__context__ = handling
        upstream = map_error(final, call.request)
        upstream.__cause__ = final
        return upstream

    @staticmethod
    def _stream_failure(error: Exception, call: DirectCall) -> tuple[Exception, BaseException]:
        """The exception LiteLLM's stream wrapper would handle, and the one it handles it within."""
        if isinstance(error, EndedWithoutFinish):
            eof = httpx.RemoteProtocolError(str(error), request=httpx.Request("POST", "https://docs.litellm.ai/docs"))
            return eof, StopAsyncIteration()
        if isinstance(error, ErrorEvent):
            event_error = openai.APIError(message=error.message, request=_request_of(error, call), body=error.body)
            return event_error, event_error
        if isinstance(error, Repetition):
            repeated = litellm.InternalServerError(
                message=f"The model is repeating the same chunk = {error.content}.", model="", llm_provider="")
            return repeated, repeated
        if isinstance(error, httpx.TimeoutException):
            sdk: Exception = openai.APITimeoutError(request=_request_of(error, call))
        elif isinstance(error, httpx.HTTPError):
            sdk = openai.APIConnectionError(request=_request_of(error, call))
        else:
            return error, error
        sdk.__cause__ = error
        return sdk, sdk

    def finish_reason(self, reason: str) -> str:
        return map_finish_reason(reason)

    def usage_estimate(self, call: DirectCall, generated: str, reasoning: str) -> dict[str, Any]:
        """Usage as LiteLLM's stream chunk builder counts it when the provider reported none."""
        messages = json.loads(call.body).get("messages") or []
        prompt = litellm.token_counter(model=call.model, messages=messages)
        completion = litellm.token_counter(model=call.model, text=generated, count_response_tokens=True) + (
            litellm.token_counter(text=reasoning, count_response_tokens=True) if reasoning else 0)
        return {"completion_tokens": completion, "prompt_tokens": prompt, "total_tokens": prompt + completion}


def _request_of(error: Exception, call: DirectCall) -> httpx.Request:
    """The request an httpx error belongs to (unset on some), else the call's."""
    try:
        request = getattr(error, "request", None)
    except RuntimeError:
        request = None
    return request if isinstance(request, httpx.Request) else httpx.Request("POST", call.url)


def _sdk_ordered(data: dict[str, Any]) -> dict[str, Any]:
    """The dict the openai SDK's unvalidated ChatCompletion dumps back: the same values, its key order."""
    model = openai._models.construct_type(type_=openai.types.chat.ChatCompletion, value=data)
    return model.model_dump(exclude_unset=True)


def _empty_model_response() -> Any:
    response = litellm.ModelResponse()
    response.usage = litellm.Usage()
    return response
