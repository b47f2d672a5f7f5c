"""Tools through the SDK: auto, required and a named tool_choice, on both APIs."""

import json

import pytest

from conftest import CHAT_TOOLS, RESPONSES_TOOLS, WEATHER_PROMPT, assert_token_fields, only

# (prompt, tool_choice as chat sends it, as Responses sends it, the call expected, the upstream's tool_choice,
#  the finish_reason)
CASES = {
    "auto": (WEATHER_PROMPT, "auto", "auto", ("get_weather", {"city": "Paris"}), "auto", "tool_calls"),
    # No JSON in the prompt: the stand-in would answer in text unless forced, as vLLM is by "required".
    "required": ("hello there", "required", "required", ("get_weather", {}), "required", "tool_calls"),
    # The policy reads get_weather; vLLM's structured output makes it call the named function, and
    # vLLM 0.32 finishes a named choice "stop" (the stand-in too: fixture
    # standin-named-tool-choice-finish-stop).
    "named": (WEATHER_PROMPT, {"type": "function", "function": {"name": "get_time"}},
              {"type": "function", "name": "get_time"}, ("get_time", {}), "function:get_time", "stop"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_chat_tool_choice(model, fake, key, case):
    prompt, choice, _, (name, args), upstream_choice, finish = CASES[case]
    r = model.client(key).chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], tools=CHAT_TOOLS, tool_choice=choice
    )
    c = only(r.choices)
    assert c.finish_reason == finish
    tc = only(c.message.tool_calls)
    assert tc.type == "function" and tc.id
    assert tc.function.name == name and json.loads(tc.function.arguments) == args
    assert_token_fields(c.message)
    req = only(fake.calls(key))["request"]
    assert req["tools"] == ["get_weather", "get_time"] and req["tool_choice"] == upstream_choice


@pytest.mark.parametrize("case", sorted(CASES))
def test_responses_tool_choice(model, fake, key, case):
    prompt, _, choice, (name, args), upstream_choice, finish = CASES[case]
    r = model.client(key).responses.create(model="m", input=prompt, tools=RESPONSES_TOOLS, tool_choice=choice)
    assert r.status == "completed"
    item = only(r.output)
    assert item.type == "function_call" and item.status == "completed"
    assert item.name == name and json.loads(item.arguments) == args and item.call_id
    assert [t.name for t in r.tools] == ["get_weather", "get_time"]
    echoed = r.tool_choice if isinstance(r.tool_choice, str) else r.tool_choice.name
    assert echoed == (choice if isinstance(choice, str) else choice["name"])
    assert_token_fields(item)
    req = only(fake.calls(key))["request"]
    assert req["tools"] == ["get_weather", "get_time"] and req["tool_choice"] == upstream_choice
    row = only(model.ledger(key)["records"])
    assert row["finish_reason"] == finish


def test_responses_tool_call_stream(model, key):
    events = list(model.client(key).responses.create(model="m", input=WEATHER_PROMPT, tools=RESPONSES_TOOLS, stream=True))
    added = only([e for e in events if e.type == "response.output_item.added"])
    assert added.item.type == "function_call" and added.item.name == "get_weather" and added.item.status == "in_progress"
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = only([e for e in events if e.type == "response.function_call_arguments.done"])
    final = events[-1].response
    item = only(final.output)
    assert "".join(deltas) == done.arguments == item.arguments
    assert json.loads(item.arguments) == {"city": "Paris"}
    assert item.call_id == added.item.call_id
    with model.client(key).responses.stream(model="m", input=WEATHER_PROMPT, tools=RESPONSES_TOOLS) as s:
        parsed = s.get_final_response()
    assert only(parsed.output).arguments == item.arguments


def test_chat_tool_call_stream_helper(model, key):
    with model.client(key).chat.completions.stream(
        model="m", messages=[{"role": "user", "content": WEATHER_PROMPT}], tools=CHAT_TOOLS
    ) as s:
        final = s.get_final_completion()
    tc = only(final.choices[0].message.tool_calls)
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {"city": "Paris"}
    assert final.choices[0].finish_reason == "tool_calls"
