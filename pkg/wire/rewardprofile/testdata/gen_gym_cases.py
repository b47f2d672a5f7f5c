"""Generates gym_cases.jsonl (one case a line): verify replies and the reply NeMo Gym's
own /aggregate_metrics gives for them, for rewardprofile's TestComputeMatchesGym.

The replies are posted to a real NeMo Gym resources server (the weather server of
nemo-gym 0.7.0, resources_servers/example_single_tool_call/app.py, whose
/aggregate_metrics is SimpleResourcesServer's: compute_aggregate_metrics of
nemo_gym/reward_profile.py with the default hooks) through FastAPI's TestClient, and
the reply text is kept as Gym wrote it.

Run it with the interop suite's pinned environment (tests/interop/envs/gym):

    $(scripts/pyenv.sh gym)/bin/python pkg/wire/rewardprofile/testdata/gen_gym_cases.py \
        > pkg/wire/rewardprofile/testdata/gym_cases.jsonl
"""

import json
import random
import warnings
from importlib.metadata import version
from unittest.mock import MagicMock

from fastapi.testclient import TestClient

from nemo_gym.server_utils import ServerClient
from resources_servers.example_single_tool_call.app import (
    SimpleWeatherResourcesServer,
    SimpleWeatherResourcesServerConfig,
)

TASK, ROLL = "_ng_task_index", "_ng_rollout_index"


def client():
    config = SimpleWeatherResourcesServerConfig(
        host="127.0.0.1", port=1, entrypoint="app.py", name="weather", domain="agent"
    )
    server = SimpleWeatherResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))
    return TestClient(server.setup_webserver(), raise_server_exceptions=False)


def random_perf(rng):
    perf = {}
    for field in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "reasoning_tokens", "num_turns"):
        if rng.random() < 0.7:
            perf[field] = rng.randint(0, 400)
    if rng.random() < 0.7:
        perf["total_latency_ms"] = rng.random() * 5000
    if rng.random() < 0.5:
        perf["token_observability_coverage"] = rng.choice([0, 0.5, 1.0])
    return perf


def random_reply(rng, task, roll, masking, perf):
    vr = {TASK: task, ROLL: roll}
    r = rng.random()
    if r < 0.3:
        vr["reward"] = float(rng.random() < 0.5)
    elif r < 0.6:
        vr["reward"] = rng.random() * 10 ** rng.randint(-3, 3)
    elif r < 0.8:
        vr["reward"] = rng.randint(0, 5)
    if rng.random() < 0.5:
        vr["correct"] = rng.random() < 0.5
    if rng.random() < 0.4:
        vr["score"] = rng.gauss(0, 1)
    if rng.random() < 0.3:
        vr["label"] = "x"
    if rng.random() < 0.2:
        # Underscored fields are Gym's bookkeeping (NeMo RL's _rowidx, the attempt index):
        # the profiler leaves them out.
        vr[rng.choice(["_rowidx", "_ng_attempt_index"])] = rng.randint(0, 9)
    if masking and rng.random() < 0.2:
        vr["mask_sample"] = True
    elif rng.random() < 0.1:
        vr["mask_sample"] = False
    if perf and rng.random() < 0.7:
        vr["ng_perf"] = random_perf(rng)
    if rng.random() < 0.8:
        usage = {"input_tokens": rng.randint(1, 500), "output_tokens": rng.randint(1, 500)}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        usage["input_tokens_details"] = {"cached_tokens": 0}
        vr["response"] = {"usage": usage}
    elif rng.random() < 0.3:
        vr["response"] = None
    return vr


def main():
    warnings.simplefilter("ignore")
    c = client()
    rng = random.Random(46)
    bodies = []
    for i in range(40):
        vrs = []
        tasks = rng.randint(1, 4)
        repeats = rng.randint(1, 6)
        for task in range(tasks):
            for roll in range(repeats):
                # Some repeats miss some tasks (a run cut short).
                if repeats > 1 and rng.random() < 0.15:
                    continue
                vrs.append(random_reply(rng, task * 3, roll, masking=i % 3 == 0, perf=i % 4 == 1))
        rng.shuffle(vrs)
        bodies.append(vrs)
    # Every reply masked; replies without indexes (Gym reads them as 0); long
    # columns past numpy's 8-wide and 128-element summation blocks.
    bodies.append([{TASK: 0, ROLL: r, "reward": 1.0, "mask_sample": True} for r in range(3)])
    bodies.append([{"reward": 0.5}, {TASK: 2, "reward": 1.0}, {ROLL: 1, "reward": 0.0}])
    bodies.append([{TASK: t, ROLL: r, "reward": rng.random() * 10 ** rng.randint(-3, 3)} for t in range(3) for r in range(100)])
    print(json.dumps({"nemo_gym": version("nemo-gym"), "cases": len(bodies)}))
    for vrs in bodies:
        reply = c.post("/aggregate_metrics", json={"verify_responses": vrs})
        if reply.status_code != 200:
            raise SystemExit(f"Gym answered {reply.status_code}: {reply.text}")
        print(json.dumps({"verify_responses": vrs, "expected": reply.text}, separators=(",", ":")))


main()
