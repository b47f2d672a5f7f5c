"""The official OpenAI Python SDK against the model server.

sdk_test.go starts fakeinference and the model servers and runs this suite
with the SDK pinned in tests/interop/envs/openai; the servers' addresses
arrive in GYMFLEET_SDK_* variables. Every scenario asserts on what the SDK
returns and on what reached the backend (fakeinference's call log and
counters, its /_ctl routes) and the capture ledger.

The SDK's own behaviour this suite relies on was read from its source in
site-packages (openai 3.63.0): _base_client.py (_should_retry: it retries
timeouts, connection errors, 408, 409, 429 and every 5xx, max_retries 2 by
default, unless the reply says x-should-retry; _make_status_error_from_response:
e.message is "Error code: N - <error.message>"), _exceptions.py (APIError
reads code, param and type from the error object), _streaming.py (a chunk
with an "error" object raises APIError) and lib/streaming/responses.
"""

import json
import os
import re
import time
import urllib.error
import urllib.request

import openai
import pytest

# The SDK release this suite was written against and ran with; the lock
# pins it (tests/interop/envs/openai/requirements.lock), README names it.
SDK_VERSION = "3.63.0"


def _env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run this suite through sdk_test.go (make test-interop-sdk)")
    return value


def http(method, url, body=None, token=None, timeout=30):
    """One plain HTTP call (not through the SDK): (status, decoded JSON or text)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if token:
        headers["Authorization"] = "Bearer " + token
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def _counter_sum(metrics_text, name, **labels):
    """Sum of a Prometheus counter's samples whose labels include labels."""
    total = 0.0
    for line in metrics_text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        m = re.match(r"^(\w+)(\{([^}]*)\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(4))
    return total


class Server:
    """A server of the fleet under test, reached over plain HTTP."""

    def __init__(self, url, token):
        self.url = url.rstrip("/")
        self.token = token

    def get(self, path, token=None):
        return http("GET", self.url + path, token=token)

    def post(self, path, body=None, token=None):
        return http("POST", self.url + path, {} if body is None else body, token=token)

    def counter(self, name, **labels):
        status, text = self.get("/metrics")
        assert status == 200, text
        return _counter_sum(text, name, **labels)

    def requests(self, route, **labels):
        """HTTP requests this server answered on route (any status)."""
        return self.counter("gymfleet_http_requests_total", route=route, **labels)

    def posts(self):
        """POST requests this server answered, on any route: a request the
        checkpoint fence refused never reached a route."""
        return self.counter("gymfleet_http_requests_total", method="POST")


class Fake(Server):
    """fakeinference: its call log, counters and controls."""

    def calls(self, key):
        status, body = self.get("/_ctl/calls")
        assert status == 200, body
        return [c for c in body["calls"] if c["capture_key"] == key]

    def chat_requests(self):
        """Chat requests fakeinference got, admitted or refused."""
        return self.requests("/v1/chat/completions")

    def hold_rollouts(self):
        """Holds every call that names a rollout until released."""
        status, body = self.post("/_ctl/hold", {"after_calls_per_rollout": 0})
        assert status == 200, body

    def release(self):
        status, body = self.post("/_ctl/release")
        assert status == 200, body
        return body["released"]


class Model(Server):
    """A model server: its OpenAI routes through the SDK, its ledger and control plane."""

    def client(self, key=None, **kwargs):
        """An SDK client, rollout-prefixed when key is given, as Gym's agents call the model server."""
        base = self.url + (f"/ng-rollout/{key}/v1" if key else "/v1")
        kwargs.setdefault("api_key", "sdk-interop")
        return openai.OpenAI(base_url=base, **kwargs)

    def ledger(self, key):
        status, body = self.get(f"/capture/rollouts/{key}/manifest")
        assert status == 200, body
        return body

    def ckpt(self, op, **body):
        body.setdefault("deadline_ts", time.time() + 60)
        # retire and forget name a checkpoint id upstream (control.py).
        if op in ("retire", "forget"):
            body.setdefault("checkpoint_id", "sdk-suite")
        return self.post(f"/ng-control/v1/checkpoint/{op}", body, token=self.token)



@pytest.fixture(scope="session")
def fake():
    return Fake(_env("GYMFLEET_SDK_FAKE_URL"), _env("GYMFLEET_SDK_TOKEN"))


@pytest.fixture(scope="session")
def model():
    return Model(_env("GYMFLEET_SDK_MODEL_URL"), _env("GYMFLEET_SDK_TOKEN"))


@pytest.fixture(scope="session")
def zombie():
    return Model(_env("GYMFLEET_SDK_ZOMBIE_URL"), _env("GYMFLEET_SDK_TOKEN"))


@pytest.fixture(scope="session")
def zombie_epoch_file():
    return _env("GYMFLEET_SDK_ZOMBIE_EPOCH_FILE")


@pytest.fixture(scope="session")
def served_model():
    return _env("GYMFLEET_SDK_SERVED_MODEL")


@pytest.fixture
def key(request):
    """A capture key of the scenario's own: a rollout id nothing else uses."""
    return "sdk-" + re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:100]


@pytest.fixture(scope="session", autouse=True)
def sdk_version():
    assert openai.__version__ == SDK_VERSION, (
        f"the environment has openai {openai.__version__}, the suite was written for {SDK_VERSION}: "
        "update SDK_VERSION and README's line with the lock"
    )


def wait_for(what, cond, timeout=20.0):
    """Polls cond until it is true, failing with what after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


WEATHER_PROMPT = 'Call get_weather with {"city": "Paris"}'

CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a zone.",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
        },
    },
]

RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]


def only(items):
    assert len(items) == 1, items
    return items[0]


def assert_token_fields(obj):
    """The training token fields the model server adds (SDK extras): contiguous, aligned."""
    extra = obj.model_extra or {}
    prompt, gen, lps = extra.get("prompt_token_ids"), extra.get("generation_token_ids"), extra.get("generation_log_probs")
    assert prompt and gen and lps, f"token fields missing among {sorted(extra)}"
    assert len(gen) == len(lps)
    return prompt, gen, lps
