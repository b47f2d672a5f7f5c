"""The SDK's timeout against a slow generation: how the call fails, what the
backend did, and what the ledger keeps.

The SDK retries a timeout (max_retries, 2 by default) as a new request: each
attempt is a new upstream call, cancelled when its client gives up, and
none is delivered, so the ledger keeps no row for any of them.
"""

import json

import openai
import pytest

from conftest import only, wait_for

# About 14 tokens at 2 a second: a generation of several seconds.
SLOW = {"fake_script": json.dumps({"tokens_per_second": 2})}


def ended(fake, key, n):
    """The n upstream calls of key, once none is generating any more."""
    def done():
        calls = fake.calls(key)
        return calls if len(calls) == n and all(c["status"] != "generating" for c in calls) else None
    return wait_for(f"{n} finished upstream calls of {key}", done)


def test_timeout_non_stream(model, fake, key):
    c = model.client(key, timeout=0.5, max_retries=0)
    with pytest.raises(openai.APITimeoutError, match="timed out"):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], metadata=SLOW)
    call = only(ended(fake, key, 1))
    assert call["status"] == "failed", "the model server cancels the upstream call its client left"
    assert call["completion_tokens"] < 14, "cut short, not generated to the end"
    ledger = model.ledger(key)
    assert ledger["records"] == [] and ledger["failures"] == []


def test_timeout_is_retried_by_the_sdk_as_new_calls(model, fake, key):
    before = model.posts()
    c = model.client(key, timeout=0.5)  # the SDK's default max_retries: 2
    with pytest.raises(openai.APITimeoutError):
        c.responses.create(model="m", input="hi", metadata=SLOW)
    calls = ended(fake, key, 3)
    assert [x["status"] for x in calls] == ["failed"] * 3
    assert len({x["call_id"] for x in calls}) == 3
    wait_for("3 requests answered", lambda: model.posts() - before >= 3)
    assert model.posts() - before == 3
    assert model.ledger(key)["records"] == []


def test_timeout_mid_stream(model, fake, key):
    c = model.client(key, timeout=1.0, max_retries=2)
    stream = c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
        metadata={"fake_script": json.dumps({"tokens_per_second": 0.5})},
    )
    got = []
    with pytest.raises(openai.APITimeoutError):
        for chunk in stream:
            got.append(chunk)
    assert got and got[0].choices[0].delta.role == "assistant", "the stream had begun"
    call = only(ended(fake, key, 1))  # a stream that began is not retried
    assert call["status"] == "failed"
    assert model.ledger(key)["records"] == []
