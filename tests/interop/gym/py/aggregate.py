"""/aggregate_metrics from our environment server and from NeMo Gym's own code.

For the rows a `gym eval run` wrote (OUT.jsonl), strip them as Gym's rollout collection
does before it posts /aggregate_metrics (rollout_collection.py _call_aggregate_metrics,
nemo-gym 0.7.0: drop response, responses_create_params, ng_agent_observations,
ng_model_call_capture, ng_trajectory; keep response.usage and
response.incomplete_details), post that body to our environment server, and compute
what Gym's own resources servers answer for it (nemo_gym.reward_profile
compute_aggregate_metrics with SimpleResourcesServer's default hooks).

Usage: python aggregate.py OUT.jsonl ENV_URL
Prints {"ours": <our reply, as sent>, "gym": <Gym's reply, as its FastAPI serializes it>,
        "collection_file": <the entries gym eval run wrote to <out>_aggregate_metrics.json>}.
"""

import json
import sys
import urllib.request
import warnings
from pathlib import Path

from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.reward_profile import AggregateMetricsMixin, compute_aggregate_metrics

STRIPPED = ("response", "responses_create_params", "ng_agent_observations", "ng_model_call_capture", "ng_trajectory")


def strip(row):
    entry = {k: v for k, v in row.items() if k not in STRIPPED}
    response = row.get("response") or {}
    metadata = {}
    if response.get("usage") is not None:
        metadata["usage"] = response["usage"]
    if response.get("incomplete_details") is not None:
        metadata["incomplete_details"] = response["incomplete_details"]
    if metadata:
        entry["response"] = metadata
    return entry


def main():
    warnings.simplefilter("ignore")
    out = Path(sys.argv[1])
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    body = AggregateMetricsRequest(verify_responses=[strip(r) for r in rows]).model_dump(mode="json")
    request = urllib.request.Request(
        sys.argv[2].rstrip("/") + "/aggregate_metrics",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    ours = json.loads(urllib.request.urlopen(request, timeout=60).read())
    hooks = AggregateMetricsMixin()
    gym = compute_aggregate_metrics(
        body["verify_responses"],
        compute_metrics_fn=hooks.compute_metrics,
        get_key_metrics_fn=hooks.get_key_metrics,
        compute_repeat_metrics_fn=hooks.compute_repeat_metrics,
    )
    collection_file = json.loads(out.with_name(out.stem + "_aggregate_metrics.json").read_text())
    print(json.dumps({
        "ours": ours,
        "gym": json.loads(AggregateMetrics.model_validate(gym).model_dump_json()),
        "collection_file": collection_file,
    }))


main()
