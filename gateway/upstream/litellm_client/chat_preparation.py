"""LiteLLM's preparation of a chat request's messages for the direct transport, remembered per message
(issue 11; used by gateway/upstream/litellm_client/direct.py).

`litellm.completion` walks every message of every request several times before an OpenAI deployment
gets it (validation, developer roles, tool-search history, PDF parts, then the config's
`transform_request`), and an agent resends its whole transcript, a few messages longer, every turn
(bench/direct_prep.py times it). For the two OpenAI configs the direct transport takes, each of those
steps maps every message on its own, except five that look at the whole list, and those leave it as
it is when no message holds what they look for:

- the developer-role translation moves instructions to the front for a model declared to take no
  system message mid-conversation (and not on api.openai.com): such a route is always prepared whole;
- tool-search calls left unanswered are dropped: a message with a tool-search call is prepared whole;
- PDF parts go for a model that cannot read them: likewise a message with a PDF part;
- media in tool messages move into a user message after them: likewise a tool message with media;
- a Claude model under drop_params gets its cache marks capped: such a route is prepared whole.

So `MessageMemo.lookup` runs LiteLLM's own steps (`message_steps`, the very functions the whole-list
path calls) on the messages it has not seen for the route and takes the others from the memo, keyed by
the exact message (`_key`); `Prepared.body` runs the config's `transform_request` on the new messages
alone and puts the remembered ones in place. Either returns None, and the caller prepares the whole
list through LiteLLM, whenever a message, the route or the request is outside what is described above.
The body it returns holds the memo's own message objects: serialise it, do not change it.
`MessageMemo.remembered` does the same for the request's fixed part (`get_optional_params`, the
Responses-bridge check), by the exact arguments of the call.
tests/gateway/upstream/test_litellm_messages.py checks that both give the same request, also as transcripts
grow, branch and get changed in place after being remembered.
"""
from __future__ import annotations

import operator
import pickle
import threading
from typing import Any, Callable, Mapping, Sequence

import orjson
from litellm import main as litellm_main
from litellm.litellm_core_utils.prompt_templates.common_utils import (
    _tool_message_carries_media,
    drop_tool_reference_parts_from_tool_messages,
    messages_have_pdf_file_part,
)
from litellm.llms.openai.chat import gpt_transformation
from litellm.responses.litellm_completion_transformation.tool_search import (
    _is_assistant_message,
    tool_search_call_ids,
)
from litellm.utils import jsonify_tools

from gateway.upstream.litellm_client.base import litellm  # first: it sets LiteLLM's offline environment
from policies.canonical import compact_json_bytes, orjson_text, trim_oldest


def _key(prefix: bytes, message: Any) -> bytes:
    """The memo's key of a message: its exact pickle after the route's. Two messages of JSON's types
    (dicts, lists, str, int, float, bool, None) pickle alike only when they hold the same types (`1`,
    `1.0`, `true` and `"1"` apart), values and key order (and share objects alike: an equal message
    built otherwise is only a miss); any other type pickles with a reference to its class, which no such
    pickle holds, and the memo keeps only messages of JSON's types (`_json_types`)."""
    if type(message) is not dict:
        raise TypeError(f"a {type(message).__name__} message")
    return prefix + pickle.dumps(message, pickle.HIGHEST_PROTOCOL)


def _copied(value: Any) -> Any:
    """A copy of a value of JSON's types (or tuples) that shares no dict or list with it; TypeError for
    another type."""
    kind = type(value)
    if kind is dict:
        return {key: _copied(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return kind(_copied(item) for item in value)
    if kind in (str, int, float, bool) or value is None:
        return value
    raise TypeError(f"a {kind.__name__}")


def _json_types(value: Any) -> bool:
    """Whether `value` holds dicts with str keys, lists, str, int, float, bool and None only."""
    kind = type(value)
    if kind is dict:
        return all(type(key) is str and _json_types(item) for key, item in value.items())
    if kind is list:
        return all(map(_json_types, value))
    return kind in (str, int, float, bool) or value is None


def _entry(before: Any, sent: Any) -> tuple[Any, Any, list[bytes | None]]:
    """What the memo keeps of a prepared message: copies, one where `transform_request` kept the message,
    and a cell for the JSON text of the message as sent, written the first time a body holding it is
    serialised (`SentMessages`)."""
    kept = _copied(before)
    return kept, kept if sent is before else _copied(sent), [None]


class SentMessages(list):  # type: ignore[type-arg]
    """A body's messages as `Prepared.body` puts them there: the memo's own copies, each with the cell
    that keeps its JSON text, so a body is serialised from the texts of the messages it sent before
    and the new ones' (`json_body`). The cells go with the messages they were made for: a list changed
    after it was made (a message added, removed or replaced) is serialised whole."""

    def __init__(self, messages: list[Any], cells: list[list[bytes | None]]) -> None:
        super().__init__(messages)
        self.made = tuple(messages)
        self.cells = cells

    def texts(self) -> list[bytes] | None:
        """Each message's JSON text (orjson's, where it is Python's), or None: the list changed since
        it was made, or a message's text is not orjson's."""
        if len(self) != len(self.made) or not all(map(operator.is_, self, self.made)):
            return None
        out = []
        for message, cell in zip(self, self.cells):
            text = cell[0]
            if text is None:
                # Copied to its own size: orjson's bytes keep the write buffer's block (4 KB for a
                # 38-byte text, measured), and the memo keeps thousands of these.
                text = cell[0] = bytes(memoryview(orjson_text(message) or b""))  # b"": not orjson's
            if not text:
                return None
            out.append(text)
        return out


def json_body(body: Mapping[str, Any]) -> bytes:
    """`compact_json_bytes(body)`, with the messages of a `SentMessages` list written from their kept
    texts: a 1,000-message body is its new messages' serialisation and a join, not a megabyte written
    again. The same bytes: orjson writes a dict as its keys' and values' texts joined, and what makes
    orjson's text differ from Python's (`orjson_text`) never spans a `,` or `:` of the structure
    (tests/gateway/upstream/test_litellm_messages.py checks both ways give the same bytes).

    The pieces are joined once, into the one buffer sent: a megabyte body built by concatenation was
    eight megabyte copies, each in memory fresh from the kernel (1.5 ms at 1,000 messages against 0.03,
    measured with timeit on 900-byte messages)."""
    messages = body.get("messages")
    texts = messages.texts() if type(messages) is SentMessages else None
    if texts is None:
        return compact_json_bytes(body)
    pieces = [b"{"]
    for key, value in body.items():
        if type(key) is not str:
            return compact_json_bytes(body)
        if len(pieces) > 1:
            pieces.append(b",")
        pieces += (orjson.dumps(key), b":")
        if value is messages:
            separated = [b","] * (2 * len(texts) - 1) if texts else []
            separated[0::2] = texts
            pieces += (b"[", *separated, b"]")
            continue
        text = orjson_text(value)
        if text is None:
            return compact_json_bytes(body)
        pieces.append(text)
    pieces.append(b"}")
    return b"".join(pieces)


def message_steps(route: Any, messages: list[Any]) -> list[Any]:
    """LiteLLM's preparation of the messages before params are mapped, in `litellm.completion`'s order
    (`route` is litellm_direct's `_DirectRoute`). Validation fills a missing role and copies tool calls
    in the caller's own message dicts, as `litellm.completion` does."""
    return _without_unanswered_tool_search_calls(route, _mapped_steps(route, messages))


def _mapped_steps(route: Any, messages: list[Any]) -> list[Any]:
    """The steps up to the developer-role translation (which maps each message alone on a route
    `_route_maps_each_message` accepts)."""
    m = litellm_main
    messages = m.validate_and_fix_openai_messages(messages=messages)
    messages = m.get_completion_messages(messages=messages, ensure_alternating_roles=False,
                                         user_continue_message=None, assistant_continue_message=None)
    messages = m.update_messages_with_model_file_ids(messages=messages, model_id=None, model_file_id_mapping={})
    return list(route.config.translate_developer_role_to_system_role(
        messages=messages, model=route.model, custom_llm_provider=route.provider, api_base=route.api_base,
        model_info={}))


def _without_unanswered_tool_search_calls(route: Any, messages: list[Any]) -> list[Any]:
    history = litellm_main._history_without_unanswered_tool_search_calls(messages, route.provider, route.config)
    return messages if history is None else list(history)


def _fix_in_place(message: dict[str, Any]) -> None:
    """What `validate_and_fix_openai_messages` does to the caller's message dict. Its `jsonify_tools`
    puts a copy of each tool call in a new list; a list of plain dicts is left as it is, since the copy
    is equal to it (and `jsonify_tools` costs a pydantic instance check per call: 5% of the gateway's
    time on a 1,000-message transcript)."""
    if not message.get("role"):
        message["role"] = "assistant"
    calls = message.get("tool_calls")
    if calls and not (type(calls) is list and all(type(call) is dict for call in calls)):
        message["tool_calls"] = jsonify_tools(tools=calls)


def _prepared_alone(messages: list[Any]) -> bool:
    """Whether the whole-list steps after the developer-role translation leave these messages (as that
    step left them) as they are, whatever messages surround them: none holds a tool-search call (among
    assistant messages, as LiteLLM looks for them), a PDF part, or media in a tool message."""
    return not (tool_search_call_ids(message for message in messages if _is_assistant_message(message))
                or messages_have_pdf_file_part(messages)
                or any(map(_tool_message_carries_media, drop_tool_reference_parts_from_tool_messages(messages))))


def _route_maps_each_message(route: Any, litellm_params: Mapping[str, Any]) -> bool:
    """Whether the route's whole-list steps (developer roles, Claude cache marks) map each message alone."""
    gpt = gpt_transformation
    return (gpt.targets_openai_hosted_endpoint(route.provider, route.api_base)
            or gpt.declared_mid_conversation_system_support(route.model, route.provider, {}) is not False) and not (
        gpt._names_claude(route.model, litellm_params) and gpt._drops_params(litellm_params))


def _chars(value: Any) -> int:
    """The characters of the strings a value of JSON's types holds."""
    kind = type(value)
    if kind is str:
        return len(value)
    if kind is dict:
        return sum(_chars(item) for item in value.values())
    if kind is list or kind is tuple:
        return sum(_chars(item) for item in value)
    return 0


class MessageMemo:
    """Prepared messages (before `transform_request`, and as sent) by route and exact message, at most
    `limit` of them (the oldest quarter dropped past it; a 1,000-message transcript of ~1 kB messages
    holds ~2 MB: the key and the prepared copy) and at most `max_chars` characters of them, keys and
    texts (the oldest dropped past it: a verbatim tool result may be megabytes, and 16,384 of those
    held after a burst of large transcripts would be gigabytes). A message of more than `largest`
    characters is prepared anew each time instead: the memo saves a copy and an encoding of it, little
    beside the reading, hashing and storing every request does for a message that large, and 28 of the
    786 KB results of a burst of 30 MiB bodies kept 22 MB of their JSON alone after it. Read without a
    lock (a message dropped meanwhile is prepared again), written under one."""

    def __init__(self, limit: int = 16384, max_chars: int = 64 * 1024 * 1024, largest: int = 256 * 1024) -> None:
        self.limit = limit
        self.max_chars = max_chars
        self.largest = min(largest, max_chars)
        self.chars = 0
        self._weights: dict[bytes, int] = {}
        self._prepared: dict[bytes, tuple[Any, Any, list[bytes | None]]] = {}
        self._calls: dict[bytes, Any] = {}  # `remembered`
        self._routes: dict[tuple[Any, ...], bool] = {}  # whether the route's whole-list steps map each message
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._prepared.clear()
            self._weights.clear()
            self.chars = 0
            self._routes.clear()
            self._calls.clear()

    def lookup(self, route: Any, messages: Sequence[Any], litellm_params: Mapping[str, Any],
               digests: Sequence[bytes | None] | None = None) -> Prepared | None:
        """The messages as `message_steps` prepares them, the new ones by it and the others from the
        memo (whose in-place fixes are made again in the caller's dicts); None when LiteLLM must prepare
        the whole list. `digests`: where a message's is known (`policies.canonical.exact_digest`, which
        is as exact as the pickle, for a message of JSON's types), the key is made of it instead."""
        config = type(route.config)
        context = (f"{config.__module__}.{config.__qualname__}", route.model, route.provider, route.api_base,
                   id(litellm.model_cost), len(litellm.model_cost))
        if not self._maps_each_message(context, route, litellm_params):
            return None
        prefix = pickle.dumps(context)
        by_digest = prefix + b"#"  # no pickle starts so
        if digests is None or len(digests) != len(messages):
            digests = [None] * len(messages)
        try:
            keys = [by_digest + digest if digest is not None else _key(prefix, message)
                    for message, digest in zip(messages, digests)]
        except Exception:  # no dict, or something pickle cannot write
            return None
        known = list(map(self._prepared.get, keys))
        new = [i for i, entry in enumerate(known) if entry is None]
        if not all(_json_types(messages[i]) for i in new):
            return None  # kept out of the memo: see `_key`
        for message, entry in zip(messages, known):
            # first, as LiteLLM's validation fixes every message before it may refuse one (a message with
            # a role and no tool calls has nothing to fix: no call for it)
            if entry is not None and (not message.get("role") or message.get("tool_calls")):
                _fix_in_place(message)
        # Else, and where LiteLLM refuses a message (in words naming its place in the whole list), the
        # whole-list path repeats the in-place fixes, which change nothing the second time.
        try:
            mapped = _mapped_steps(route, [messages[i] for i in new])
        except Exception:
            return None
        if len(mapped) != len(new) or not _prepared_alone(mapped):
            return None
        if _without_unanswered_tool_search_calls(route, mapped) is not mapped:
            return None  # cannot be: no message holds a tool-search call
        return Prepared(self, known, [keys[i] for i in new], mapped)

    def _maps_each_message(self, context: tuple[Any, ...], route: Any, litellm_params: Mapping[str, Any]) -> bool:
        maps = self._routes.get(context)
        if maps is None:
            maps = _route_maps_each_message(route, litellm_params)
            with self._lock:
                self._routes[context] = maps
                trim_oldest(self._routes, 256)
        return maps

    def remembered(self, name: str, arguments: Mapping[str, Any], compute: Callable[[], Any]) -> Any:
        """`compute()`, a LiteLLM call that reads `arguments`, LiteLLM's model map and module settings (which
        the gateway never changes) and nothing else, remembered by its `name` and exact `arguments`; a
        copy each time. Computed every time for arguments or a result of other than JSON's types."""
        if not _json_types(dict(arguments)):
            return compute()
        key = pickle.dumps((name, id(litellm.model_cost), len(litellm.model_cost), arguments))
        kept = self._calls.get(key)
        if kept is None:
            result = compute()
            try:
                kept = _copied(result)
            except TypeError:
                return result
            with self._lock:
                self._calls[key] = kept
                trim_oldest(self._calls, 1024)
            return result
        return _copied(kept)

    def _remember(self, keys: list[bytes], entries: list[tuple[Any, Any, list[bytes | None]]]) -> None:
        if not keys:
            return
        weights = [len(key) + _chars(entry[1]) for key, entry in zip(keys, entries)]
        with self._lock:
            for key, entry, weight in zip(keys, entries, weights):
                if weight > self.largest:
                    continue
                self.chars += weight - self._weights.get(key, 0)
                self._prepared[key] = entry
                self._weights[key] = weight
            if len(self._prepared) > self.limit:
                trim_oldest(self._prepared, self.limit)
                for gone in [key for key in self._weights if key not in self._prepared]:
                    self.chars -= self._weights.pop(gone)
            while self.chars > self.max_chars:
                oldest = next(iter(self._prepared))
                del self._prepared[oldest]
                self.chars -= self._weights.pop(oldest)


class Prepared:
    """One request's messages, prepared partly from the memo (`MessageMemo.lookup`)."""

    def __init__(self, memo: MessageMemo, known: list[tuple[Any, Any, list[bytes | None]] | None], new_keys: list[bytes],
                 before_new: list[Any]) -> None:
        self._memo, self._known, self._new_keys = memo, known, new_keys
        self._before_new = before_new
        fresh = iter(before_new)
        self.messages = [entry[0] if entry is not None else next(fresh) for entry in known]

    def body(self, transform: Callable[[list[Any]], dict[str, Any]], prompt_cache_options: Any) -> dict[str, Any] | None:
        """`transform` (the config's `transform_request` with the request's params) of the messages, run
        on the new ones only; None under `prompt_cache_options` (the memo keeps messages as sent without)."""
        if prompt_cache_options is not None:
            return None
        try:
            body = transform(self._before_new)
        except Exception:  # LiteLLM's words for it, from the whole list
            return None
        sent_new = body["messages"]
        if len(sent_new) != len(self._before_new):
            return None
        try:
            entries = [_entry(before, sent) for before, sent in zip(self._before_new, sent_new)]
        except TypeError:
            return None
        fresh = iter(entries)  # the new messages as the memo keeps them: equal to `sent_new`'s
        placed = [entry if entry is not None else next(fresh) for entry in self._known]
        body["messages"] = SentMessages([entry[1] for entry in placed], [entry[2] for entry in placed])
        self._memo._remember(self._new_keys, entries)
        return body
