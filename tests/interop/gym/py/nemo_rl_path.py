"""NeMo RL's call path into NeMo Gym, with Gym's own code, against a gymfleet fleet.

It does what NemoGym._spinup and NemoGym.run_rollouts do (NVIDIA-NeMo/RL @
7ea279abfbeb, nemo_rl/environments/nemo_gym.py, lines ~535-750): build the initial
global config (config_paths from NeMo RL's env.nemo_gym, the policy keys, the port
range, the aiohttp limits, the Ray head's GCS address, the head server on 0.0.0.0),
RunHelper().start(...) with skip_load_from_cli, then
RolloutCollectionHelper().run_examples(rows, head_server_config) and, for every
(row, result) it yields, NeMo RL's reads (nemorl.postprocess). Finally
RunHelper.shutdown, as NemoGym.shutdown does.

Usage: python nemo_rl_path.py SPEC.json
SPEC: {config_paths, policy_base_url, policy_model_name, head_port, port_range: [lo, hi],
       ray_address, rows_file, extra_config: {...}, dotenv_dir, out_file}
Writes one JSON object to out_file (Gym prints to stdout): {"results": [...],
"head_instances": [...]}.
"""

import asyncio
import json
import sys
from pathlib import Path

import ray
from omegaconf import DictConfig

from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.server_utils import HEAD_SERVER_KEY_NAME, BaseServerConfig, ServerClient

sys.path.insert(0, str(Path(__file__).parent))
from nemorl import postprocess  # noqa: E402


def main():
    spec = json.loads(Path(sys.argv[1]).read_text())
    rows = [json.loads(line) for line in Path(spec["rows_file"]).read_text().splitlines() if line.strip()]

    # NeMo RL asserts Ray is initialized in the actor and hands Gym its GCS address.
    ray.init(address=spec["ray_address"], ignore_reinit_error=True, log_to_driver=False)
    ray_context = ray.get_runtime_context()
    assert ray_context.gcs_address, "Ray must have a GCS address"

    initial = dict(spec.get("extra_config") or {})
    initial["config_paths"] = spec["config_paths"]
    initial["policy_model_name"] = spec["policy_model_name"]
    initial["policy_api_key"] = "dummy_key"
    initial["policy_base_url"] = spec["policy_base_url"]
    initial.setdefault("default_host", "127.0.0.1")
    initial["port_range_low"], initial["port_range_high"] = spec["port_range"]
    initial.setdefault("global_aiohttp_connector_limit_per_host", 16_384)
    initial.setdefault("global_aiohttp_connector_limit", 65_536)
    initial["ray_head_node_address"] = ray_context.gcs_address
    initial[HEAD_SERVER_KEY_NAME] = {"host": "0.0.0.0", "port": spec["head_port"]}

    rh = RunHelper()
    rh.start(
        global_config_dict_parser_config=GlobalConfigDictParserConfig(
            dotenv_path=Path(spec["dotenv_dir"]) / "nemo_gym_env.yaml",
            initial_global_config_dict=DictConfig(initial),
            skip_load_from_cli=True,
        )
    )
    try:
        head = BaseServerConfig(host="127.0.0.1", port=spec["head_port"])
        # What run_examples reads first: the head server's global config.
        served = ServerClient.load_from_global_config(head).global_config_dict
        results = asyncio.run(run_rollouts(rows, head))
    finally:
        rh.shutdown()
    Path(spec["out_file"]).write_text(
        json.dumps({"results": results, "head_instances": sorted(str(k) for k in served.keys())})
    )


async def run_rollouts(rows, head):
    rch = RolloutCollectionHelper()
    out = []
    for task in rch.run_examples(examples=rows, head_server_config=head):
        row, result = await task
        out.append(postprocess(row, result))
    return out


if __name__ == "__main__":
    main()
