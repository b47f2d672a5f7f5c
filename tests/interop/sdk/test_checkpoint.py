"""A checkpoint holds model calls rather than refusing them, and no SDK
retry makes one generate twice.

While a checkpoint is open on the model server, a call that arrives waits
unadmitted until the resume. A client that gives up meanwhile (the SDK's
timeout, then its retries) must leave nothing behind: an abandoned request
sent upstream after the resume would generate for nobody.
"""

import os
import tempfile
import threading

import openai
import pytest

from conftest import only, wait_for

HI = [{"role": "user", "content": "hi"}]


def prepare(model, key):
    status, body = model.ckpt("prepare", checkpoint_id=f"c-{key}"[:120])
    assert status == 200 and body["phase"] == "prepared", body


def resume(model, key):
    status, body = model.ckpt("resume", checkpoint_id=f"c-{key}"[:120])
    assert status == 200 and body["phase"] == "idle", body


def waiting(model):
    return model.counter("gymfleet_http_requests_in_flight") - 1  # less the /metrics request itself


def test_call_during_checkpoint_waits_and_runs_once(model, fake, key):
    prepare(model, key)
    result = {}

    def call():
        try:
            result["r"] = model.client(key, timeout=30).chat.completions.create(model="m", messages=HI)
        except Exception as e:  # reported below
            result["e"] = e

    t = threading.Thread(target=call)
    try:
        t.start()
        wait_for("the call to wait at the model server", lambda: waiting(model) >= 1)
        assert fake.calls(key) == [], "nothing goes upstream while the checkpoint is open"
    finally:
        resume(model, key)
        t.join(30)
    assert "e" not in result, result.get("e")
    assert result["r"].choices[0].finish_reason == "stop"
    assert only(fake.calls(key))["status"] == "returned"
    assert len(model.ledger(key)["records"]) == 1


def test_sdk_giving_up_during_checkpoint_leaves_no_upstream_call(model, fake, key):
    prepare(model, key)
    before = model.posts()
    try:
        with pytest.raises(openai.APITimeoutError):
            model.client(key, timeout=0.5).chat.completions.create(model="m", messages=HI)  # 3 attempts
        # Each abandoned request ends while the checkpoint is still open.
        wait_for("the 3 abandoned requests to end", lambda: model.posts() - before >= 3)
        assert waiting(model) == 0
    finally:
        resume(model, key)
    r = model.client(key).chat.completions.create(model="m", messages=HI)
    assert r.choices[0].finish_reason == "stop"
    assert only(fake.calls(key))["status"] == "returned", "only the call after the resume went upstream"
    assert len(model.ledger(key)["records"]) == 1


def test_zombie_refuses_without_sdk_retries(zombie, zombie_epoch_file, fake, key):
    """A process a restore superseded refuses with stale_epoch; the SDK does not send again."""
    r = zombie.client(key).chat.completions.create(model="m", messages=HI)
    assert r.choices[0].finish_reason == "stop"
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(zombie_epoch_file))
    with os.fdopen(fd, "w") as f:
        f.write("7\n")
    os.replace(tmp, zombie_epoch_file)  # a restore elsewhere moved the fleet to epoch 7
    before, upstream = zombie.posts(), fake.chat_requests()
    with pytest.raises(openai.ConflictError) as ei:
        zombie.client(key).chat.completions.create(model="m", messages=HI)
    e = ei.value
    assert e.code == "stale_epoch"
    assert e.message == "Error code: 409 - this process is of epoch 0 and the fleet was restored into epoch 7; it serves nothing more"
    assert e.response.headers["x-should-retry"] == "false"
    wait_for("the refusal to be counted", lambda: zombie.posts() > before)
    assert zombie.posts() - before == 1
    assert fake.chat_requests() == upstream
    assert len(fake.calls(key)) == 1
