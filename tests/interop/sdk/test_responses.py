"""Responses through the SDK: create, streamed events as the SDK parses them."""

import pytest

from conftest import RESPONSES_TOOLS, WEATHER_PROMPT, assert_token_fields, only

GREETING = "Hello! How can I help you?"


def test_responses_create(model, fake, key, served_model):
    r = model.client(key).responses.create(model="m", input="hi", temperature=0.5, max_output_tokens=64)
    assert r.status == "completed"
    assert r.output_text == GREETING
    assert r.object == "response" and r.model == served_model
    msg = only(r.output)
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "completed"
    part = only(msg.content)
    assert part.type == "output_text" and part.text == GREETING
    assert r.temperature == 0.5 and r.max_output_tokens == 64
    prompt, gen, lps = assert_token_fields(msg)
    assert r.usage.input_tokens == len(prompt) and r.usage.output_tokens == len(gen)

    call = only(fake.calls(key))
    assert call["status"] == "returned"
    assert call["request"]["temperature"] == 0.5 and call["request"]["max_tokens"] == 64
    row = only(model.ledger(key)["records"])
    assert row["call_id"] == call["call_id"] and row["generation_token_ids"] == gen


def test_responses_stream_events(model, fake, key):
    events = list(model.client(key).responses.create(model="m", input="hi", stream=True))
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert types[4 : 4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert types[4 + len(deltas) :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert all(e.logprobs == [] for e in deltas), "OpenAI's text deltas always carry a logprobs list"
    done = events[-4]
    assert done.text == "".join(e.delta for e in deltas) == GREETING and done.logprobs == []
    created, completed = events[0].response, events[-1].response
    assert created.id == completed.id and created.status == "in_progress" and completed.status == "completed"
    assert completed.output_text == GREETING
    item_id = events[2].item.id
    assert all(e.item_id == item_id for e in deltas) and completed.output[0].id == item_id
    assert_token_fields(completed.output[0])
    call = only(fake.calls(key))
    assert call["stream"] and call["request"]["include_usage"]
    assert only(model.ledger(key)["records"])["call_id"] == call["call_id"]


def test_responses_stream_helper(model, key):
    with model.client(key).responses.stream(model="m", input="hi") as s:
        texts = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(texts) == final.output_text == GREETING
    assert len(model.ledger(key)["records"]) == 1


def test_responses_incomplete(model, fake, key):
    r = model.client(key).responses.create(model="m", input="hi", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3
    assert only(fake.calls(key))["request"]["max_tokens"] == 3


def test_responses_stream_incomplete_ends_with_response_incomplete(model, fake, key):
    events = list(model.client(key).responses.create(model="m", input="hi", max_output_tokens=3, stream=True))
    last = events[-1]
    assert last.type == "response.incomplete", [e.type for e in events]
    assert last.response.status == "incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
    # The SDK's helper finishes only on response.completed, as against OpenAI.
    with model.client(key).responses.stream(model="m", input="hi", max_output_tokens=3) as s:
        with pytest.raises(RuntimeError, match="response.completed"):
            s.get_final_response()
    assert [c["finish_reason"] for c in fake.calls(key)] == ["length", "length"]


def test_responses_tool_round_trip(model, fake, key):
    """A Gym agent's two calls: a function call, then its output sent back with the history."""
    c = model.client(key)
    first = c.responses.create(model="m", input=WEATHER_PROMPT, tools=RESPONSES_TOOLS)
    fc = only(first.output)
    assert fc.type == "function_call" and fc.name == "get_weather"
    history = [{"role": "user", "content": WEATHER_PROMPT}, *first.output,
               {"type": "function_call_output", "call_id": fc.call_id, "output": '{"weather": "sunny"}'}]
    second = c.responses.create(model="m", input=history, tools=RESPONSES_TOOLS)
    assert second.status == "completed"
    assert second.output_text == 'The answer is: {"weather": "sunny"}'
    calls = fake.calls(key)
    assert [x["n_messages"] for x in calls] == [1, 3]
    rows = model.ledger(key)["records"]
    assert [r["call_id"] for r in rows] == [x["call_id"] for x in calls]
    assert rows[1]["parent_call_id"] == rows[0]["call_id"]
