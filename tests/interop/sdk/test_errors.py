"""SDK errors carry our message and stable code, and no 4xx is retried.

The SDK retries 408, 409, 429 and every 5xx on its own unless the reply
says x-should-retry (openai 3.63.0, _base_client.py _should_retry). The
model server says false on every refusal but those that did no work and may
pass later, so no refusal turns into silent retries: each scenario counts
the requests the model server answered and the upstream calls.
"""

import json

import openai
import pytest

from conftest import CHAT_TOOLS, only, wait_for

HI = [{"role": "user", "content": "hi"}]


class Counts:
    """Requests the model server answered and chat requests the upstream got, since creation."""

    def __init__(self, model, fake):
        self.model, self.fake = model, fake
        self.posts0, self.upstream0 = model.posts(), fake.chat_requests()

    def assert_once(self, upstream):
        wait_for("the request to be counted", lambda: self.model.posts() > self.posts0)
        assert self.model.posts() - self.posts0 == 1, "the SDK sent the request again"
        assert self.fake.chat_requests() - self.upstream0 == upstream


def check(e, status, code, message, param=None):
    """What an SDK user reads of our error: status, stable code, message, body."""
    assert e.status_code == status
    assert e.code == code
    assert e.message == f"Error code: {status} - {message}"
    assert e.body["message"] == e.body["detail"] == message
    assert e.body["code"] == code
    assert e.param == param
    assert e.response.headers["x-should-retry"] == "false"


def test_400_ours(model, fake, key):
    n = Counts(model, fake)
    with pytest.raises(openai.BadRequestError) as ei:
        model.client(key).chat.completions.create(model="m", messages=HI, n=2)
    check(ei.value, 400, "invalid_request", "n must be 1: token ids are captured for one choice", "n")
    assert ei.value.type == "invalid_request_error"
    n.assert_once(upstream=0)


def test_400_upstream_kept(model, fake, key):
    """vLLM's refusal keeps its status, message, type and param."""
    n = Counts(model, fake)
    with pytest.raises(openai.BadRequestError) as ei:
        model.client(key).chat.completions.create(model="m", messages=HI, tools=CHAT_TOOLS,
                                                   tool_choice={"type": "function", "function": {"name": "nope"}})
    check(ei.value, 400, "invalid_request",
          "The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice")
    assert ei.value.type == "BadRequestError"
    n.assert_once(upstream=1)
    assert fake.calls(key) == [], "refused upstream, never generated"


def test_404(model, fake):
    n = Counts(model, fake)
    with pytest.raises(openai.NotFoundError) as ei:
        model.client().embeddings.create(model="m", input="x")
    check(ei.value, 404, "not_found", "no route POST /v1/embeddings")
    assert ei.value.type == "not_found_error"
    n.assert_once(upstream=0)


def test_409_stale_attempt_is_not_retried(model, fake, key):
    status, body = model.ckpt("retire", episode_ids=[{"rollout_id": key, "attempt": 0}])
    assert status == 200 and body["retired"] == [key], body
    for call in (lambda c: c.chat.completions.create(model="m", messages=HI),
                 lambda c: c.responses.create(model="m", input="hi")):
        n = Counts(model, fake)
        with pytest.raises(openai.ConflictError) as ei:
            call(model.client(key))
        check(ei.value, 409, "stale_attempt", f"attempt 0 of rollout {key} was retired")
        n.assert_once(upstream=0)
    status, body = model.ckpt("forget", rollout_ids=[key])
    assert status == 200, body
    r = model.client(key).chat.completions.create(model="m", messages=HI)
    assert r.choices[0].finish_reason == "stop", "forgotten, the rollout runs again"


def test_422_unknown_responses_field(model, fake, key):
    n = Counts(model, fake)
    with pytest.raises(openai.UnprocessableEntityError) as ei:
        model.client(key).responses.create(model="m", input="hi", prompt_cache_key="k")
    check(ei.value, 422, "invalid_request", "unknown request fields: prompt_cache_key", "prompt_cache_key")
    n.assert_once(upstream=0)


# The Responses parameters the model server does not implement: refused,
# naming them, rather than answered as if honoured.
REFUSED = {
    "previous_response_id": ({"previous_response_id": "resp_1"}, "previous_response_id is not supported"),
    "store": ({"store": True}, "store: true is not supported"),
    "background": ({"background": True}, "background: true is not supported"),
    "prompt": ({"prompt": {"id": "pmpt_1"}}, "prompt templates are not supported"),
    "truncation": ({"truncation": "auto"}, 'truncation "auto" is not supported'),
    "text.format": ({"text": {"format": {"type": "json_object"}}}, 'text.format of type "json_object" is not supported'),
    "include": ({"include": ["reasoning.encrypted_content"]}, 'include "reasoning.encrypted_content" is not supported'),
}


@pytest.mark.parametrize("param", sorted(REFUSED))
def test_refused_responses_parameter(model, fake, key, param):
    kwargs, text = REFUSED[param]
    n = Counts(model, fake)
    with pytest.raises(openai.BadRequestError) as ei:
        model.client(key).responses.create(model="m", input="hi", **kwargs)
    e = ei.value
    assert e.code == "invalid_request" and e.param == param
    assert e.message.startswith(f"Error code: 400 - {text}")
    assert e.response.headers["x-should-retry"] == "false"
    n.assert_once(upstream=0)
    assert fake.calls(key) == []


SCRIPTED_FAILURE = {"fake_script": json.dumps(
    {"stream_error": {"after_tokens": 3, "code": 500, "message": "the engine died", "type": "InternalServerError"}})}


def test_5xx_after_generating_is_not_retried(model, fake, key):
    n = Counts(model, fake)
    with pytest.raises(openai.InternalServerError) as ei:
        model.client(key).chat.completions.create(model="m", messages=HI, metadata=SCRIPTED_FAILURE)
    e = ei.value
    assert e.status_code == 502 and e.code == "upstream_error"
    assert e.message == "Error code: 502 - upstream answered 500: the engine died"
    assert e.body["detail"] == e.body["message"] == "upstream answered 500: the engine died"
    assert e.response.headers["x-should-retry"] == "false"
    n.assert_once(upstream=1)
    call = only(fake.calls(key))
    assert call["status"] == "failed" and call["completion_tokens"] == 3
    assert model.ledger(key)["records"] == []


def test_5xx_mid_stream(model, fake, key):
    got = []
    with pytest.raises(openai.APIError) as ei:
        for chunk in model.client(key).chat.completions.create(model="m", messages=HI, stream=True, metadata=SCRIPTED_FAILURE):
            got.append(chunk)
    e = ei.value
    assert e.message == "the engine died" and e.code == "upstream_error"
    assert e.body["type"] == "InternalServerError"
    assert "".join(c.choices[0].delta.content or "" for c in got if c.choices) == "Hello! "
    ledger = model.ledger(key)
    assert ledger["records"] == []
    assert only(ledger["failures"])["call_id"] == only(fake.calls(key))["call_id"]


def test_5xx_mid_stream_responses(model, fake, key):
    events = list(model.client(key).responses.create(model="m", input="hi", stream=True, metadata=SCRIPTED_FAILURE))
    last = events[-1]
    assert last.type == "response.failed"
    assert last.response.status == "failed"
    assert last.response.error.code == "upstream_error" and last.response.error.message == "the engine died"
    assert model.ledger(key)["records"] == []
    assert only(fake.calls(key))["status"] == "failed"
