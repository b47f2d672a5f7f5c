"""Capture under /ng-rollout/<id>/... base URLs, as NeMo Gym's agents call the model server."""

from conftest import RESPONSES_TOOLS, WEATHER_PROMPT, assert_token_fields, only


def test_capture_gym_agent_paths(model, fake, key):
    """Gym's agents call /ng-rollout/<id>/training-token-capture/v1/responses when training capture is on."""
    base = f"{key}/training-token-capture"
    c = model.client(base)
    first = c.responses.create(model="m", input=WEATHER_PROMPT, tools=RESPONSES_TOOLS)
    fc = only(first.output)
    second = c.responses.create(model="m", tools=RESPONSES_TOOLS, input=[
        {"role": "user", "content": WEATHER_PROMPT}, *first.output,
        {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"},
    ])
    calls = fake.calls(key)
    assert [x["capture_key"] for x in calls] == [key, key]
    assert [x["rollout_id"] for x in calls] == [key, key] and [x["attempt"] for x in calls] == [0, 0]
    ledger = model.ledger(key)
    rows = ledger["records"]
    assert ledger["rollout_id"] == key
    assert [r["call_id"] for r in rows] == [x["call_id"] for x in calls]
    assert rows[0]["parent_call_id"] == "" and rows[1]["parent_call_id"] == rows[0]["call_id"]
    for resp, row in zip((first, second), rows):
        prompt, gen, lps = assert_token_fields(resp.output[-1])
        assert (row["prompt_token_ids"], row["generation_token_ids"], row["generation_log_probs"]) == (prompt, gen, lps)
    # The second prompt continues the first call's tokens, as NeMo RL asserts.
    p1, g1, _ = assert_token_fields(first.output[-1])
    p2, _, _ = assert_token_fields(second.output[-1])
    assert p2[: len(p1) + len(g1)] == p1 + g1


def test_capture_attempt_key(model, fake, key):
    attempt = f"{key}-a2"
    r = model.client(attempt).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    call = only(fake.calls(attempt))
    assert call["rollout_id"] == key and call["attempt"] == 2
    assert only(model.ledger(attempt)["records"])["call_id"] == call["call_id"]
    assert model.ledger(key)["records"] == []
    assert_token_fields(r.choices[0].message)
