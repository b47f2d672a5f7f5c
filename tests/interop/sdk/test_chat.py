"""Chat Completions through the SDK, plain and streamed."""

from conftest import assert_token_fields, only

GREETING = "Hello! How can I help you?"


def test_chat_plain(model, fake, key, served_model):
    r = model.client(key).chat.completions.create(model="any-name", messages=[{"role": "user", "content": "hi"}])
    choice = only(r.choices)
    assert choice.message.content == GREETING
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    assert choice.logprobs is None, "log-probs the client did not ask for"
    assert r.model == served_model
    assert r.object == "chat.completion"
    prompt, gen, lps = assert_token_fields(choice.message)
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(gen)
    assert r.usage.total_tokens == len(prompt) + len(gen)

    call = only(fake.calls(key))
    assert call["status"] == "returned" and not call["stream"]
    assert call["completion_tokens"] == len(gen) and call["prompt_tokens"] == len(prompt)
    req = call["request"]
    assert req["model"] == served_model, "the model server names its upstream's model"
    assert req["return_token_ids"] and req["logprobs"]

    row = only(model.ledger(key)["records"])
    assert row["call_id"] == call["call_id"]
    assert row["prompt_token_ids"] == prompt and row["generation_token_ids"] == gen
    assert row["generation_log_probs"] == lps
    assert row["finish_reason"] == "stop"


def test_chat_stream(model, fake, key):
    stream = model.client(key).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == GREETING
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices), "log-probs the client did not ask for"
    usage = only([c.usage for c in chunks if c.usage])
    assert not chunks[-1].choices and chunks[-1].usage == usage, "the usage chunk ends the stream"
    assert len({c.id for c in chunks}) == 1

    call = only(fake.calls(key))
    assert call["stream"] and call["status"] == "returned"
    assert call["request"]["include_usage"]
    row = only(model.ledger(key)["records"])
    assert row["call_id"] == call["call_id"]
    assert len(row["generation_token_ids"]) == usage.completion_tokens == call["completion_tokens"]
    # vLLM's own token ids ride on the chunks (return_token_ids): the same the ledger kept.
    streamed_ids = [i for c in chunks if c.choices for i in (c.choices[0].model_extra or {}).get("token_ids") or []]
    assert streamed_ids == row["generation_token_ids"]


def test_chat_stream_helper(model, fake, key):
    with model.client(key).chat.completions.stream(model="m", messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.content == GREETING
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].logprobs is None
    assert only(fake.calls(key))["status"] == "returned"
    assert len(model.ledger(key)["records"]) == 1


def test_chat_unprefixed_is_not_captured(model, fake):
    before = fake.chat_requests()
    r = model.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == GREETING
    assert fake.chat_requests() == before + 1
    status, body = fake.get("/_ctl/calls")
    last = body["calls"][-1]
    assert last["capture_key"] is None and last["status"] == "returned"
