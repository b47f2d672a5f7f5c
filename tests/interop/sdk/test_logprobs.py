"""Log-probs the client asks for: chat logprobs/top_logprobs, Responses include."""

from conftest import assert_token_fields, only

INCLUDE = ["message.output_text.logprobs"]


def test_chat_logprobs(model, fake, key):
    r = model.client(key).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=2
    )
    c = only(r.choices)
    content = c.logprobs.content
    _, gen, lps = assert_token_fields(c.message)
    assert len(content) == len(gen) == r.usage.completion_tokens
    assert [e.logprob for e in content] == lps, "the ledger's log-probs are the ones the client read"
    for e in content:
        assert not e.token.startswith("token_id:"), "token strings, as the client asked"
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == e.logprob
    assert "".join(e.token for e in content[:-1]) == c.message.content
    req = only(fake.calls(key))["request"]
    assert req["logprobs"] and req["top_logprobs"] == 2 and not req["return_tokens_as_token_ids"]
    assert only(model.ledger(key)["records"])["generation_log_probs"] == lps


def test_chat_stream_logprobs(model, key):
    chunks = list(model.client(key).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=1, stream=True
    ))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    row = only(model.ledger(key)["records"])
    assert [e.logprob for e in entries] == row["generation_log_probs"]
    assert all(len(e.top_logprobs) == 1 for e in entries)


def test_responses_include_logprobs(model, fake, key):
    r = model.client(key).responses.create(model="m", input="hi", include=INCLUDE, top_logprobs=2)
    assert r.top_logprobs == 2, "echoed, as OpenAI's Response does"
    part = only(only(r.output).content)
    _, gen, lps = assert_token_fields(r.output[0])
    assert [e.logprob for e in part.logprobs] == lps
    assert len(part.logprobs) == len(gen)
    assert all(len(e.top_logprobs) == 2 for e in part.logprobs)
    req = only(fake.calls(key))["request"]
    assert req["logprobs"] and req["top_logprobs"] == 2


def test_responses_stream_include_logprobs(model, key):
    events = list(model.client(key).responses.create(model="m", input="hi", include=INCLUDE, top_logprobs=1, stream=True))
    streamed = [e for ev in events if ev.type == "response.output_text.delta" for e in ev.logprobs]
    done = only([ev for ev in events if ev.type == "response.output_text.done"])
    final = events[-1].response.output[0].content[0].logprobs
    row = only(model.ledger(key)["records"])
    text_lps = [e.logprob for e in final]
    assert [e.logprob for e in done.logprobs] == text_lps
    # The last generated token (end of turn) has no text, so no delta carries it.
    assert [e.logprob for e in streamed] == text_lps[: len(streamed)]
    assert text_lps == row["generation_log_probs"]


def test_responses_without_include_has_no_logprobs(model, key):
    r = model.client(key).responses.create(model="m", input="hi")
    assert not only(r.output).content[0].logprobs
