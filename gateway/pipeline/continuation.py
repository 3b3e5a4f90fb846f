"""A Responses request that names `previous_response_id`, made the whole transcript it continues.

The gateway holds every transcript it forwarded, so it answers the reference itself, whatever the
upstream (the provider is sent `store: false` and the whole transcript). Any format whose parse sets
`NeutralRequest.previous_response_id` is continued this way; today only OpenAI Responses does.
"""
from __future__ import annotations

from dataclasses import replace

from gateway.errors import InvalidRequest
from gateway.pipeline.run_recorder import outcomes_written
from gateway.services import Services
from gateway.threads import off_loop
from gateway.wire import NeutralRequest
from gateway.wire.openai_responses import check_pairs, output_to_neutral, request_id_for


async def continued(services: Services, tenant: str, neutral: NeutralRequest) -> NeutralRequest:
    """`neutral` with the transcript it continues: the stored request's messages and its response's
    output, then the new input (as OpenAI does, the earlier request's `instructions` are not carried
    over); within server.max_messages, its calls and results paired."""
    previous = neutral.previous_response_id or ""
    request_id = request_id_for(previous)
    await outcomes_written()  # the answer it names may have been sent a moment before its record
    record = await off_loop(services.store.get_run, request_id, tenant) if request_id else None
    response = (record.run.get("response") or {}) if record else {}
    if record is None or not response or record.run.get("wire_format") != "openai.responses" \
            or not response.get("store", True) \
            or record.run.get("status") != "ok":
        raise InvalidRequest(f"Previous response with id '{previous}' not found.", param="previous_response_id",
                             code="previous_response_not_found")
    earlier = await off_loop(services.store.path_messages, record.run["leaf_node_id"])
    earlier = [{k: v for k, v in m.items() if k != "artifact_id"} for m in earlier]
    if earlier and earlier[0].get("role") == "system" and "responses_item" not in earlier[0]:
        earlier = earlier[1:]  # the earlier request's instructions
    new = neutral.messages
    instructions = new[:1] if new and new[0].get("role") == "system" and "responses_item" not in new[0] else []
    messages = [*instructions, *earlier, *output_to_neutral(response.get("output") or []), *new[len(instructions):]]
    _check_count(messages, services.settings.server.max_messages)
    check_pairs(messages)
    return replace(neutral, messages=messages, digests=None)


def _check_count(messages: list[dict], limit: int) -> None:
    """The transcript a `previous_response_id` continues, with the new input, within the message limit."""
    if len(messages) > limit:
        raise InvalidRequest(f"previous_response_id: the conversation it continues holds {len(messages)}"
                             f" messages with this input; this gateway takes at most {limit} per request"
                             " (server.max_messages)", param="previous_response_id", code="too_many_messages")
