"""A `gym eval run` output read the way NeMo RL reads a result, with each rollout's
capture key and model calls.

For every row of OUT.jsonl: nemorl.postprocess (NeMo RL's checks: contiguous token
ids, a float reward), the capture key Gym's agents put in /ng-rollout/<key>/
(nemo_gym.rollout_correlation.maybe_rollout_id_from_run_body, nemo-gym 0.7.0), and the
token ids of each trainable output item, one per model call.

Usage: python rollouts.py OUT.jsonl
Prints a JSON list.
"""

import json
import sys
from pathlib import Path

from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body

sys.path.insert(0, str(Path(__file__).parent))
from nemorl import is_trainable_output_item, postprocess  # noqa: E402


def main():
    out = []
    for line in Path(sys.argv[1]).read_text().splitlines():
        if not line.strip():
            continue
        result = json.loads(line)
        calls = [
            {"prompt_token_ids": item["prompt_token_ids"], "generation_token_ids": item["generation_token_ids"]}
            for item in result["response"]["output"]
            if is_trainable_output_item(item)
        ]
        read = postprocess(dict(result), json.loads(line))
        out.append(
            {
                "task": result.get("_ng_task_index"),
                "rollout": result.get("_ng_rollout_index"),
                "agent": result["agent_ref"]["name"],
                "environment_server": result.get("_ng_environment_server"),
                "reward": read["reward"],
                "capture_key": maybe_rollout_id_from_run_body(result),
                "calls": calls,
            }
        )
    print(json.dumps(out))


main()
