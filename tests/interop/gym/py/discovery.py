"""Which server every name resolves to, as NeMo Gym's own client resolves it.

ServerClient.load_from_global_config(head) GETs the head server's
/global_config_dict_yaml (nemo_gym/server_utils.py, nemo-gym 0.7.0) and
ServerClient._resolve_base_url(name) takes the first kind and the first
implementation under the name (get_first_server_config_dict) and builds
http://{host}:{port}: what every Gym client (rollout collection, NeMo RL, Gym's
servers) calls a server by.

Usage: python discovery.py HOST PORT
Prints {"head_server": {...}, "instances": {name: {"kind": ..., "url": ...}}}.
"""

import json
import sys

from omegaconf import DictConfig

from nemo_gym.server_utils import BaseServerConfig, ServerClient

KINDS = ("responses_api_models", "resources_servers", "responses_api_agents", "environment_servers")


def main():
    head = BaseServerConfig(host=sys.argv[1], port=int(sys.argv[2]))
    client = ServerClient.load_from_global_config(head)
    cfg = client.global_config_dict
    instances = {}
    for name, block in cfg.items():
        if not isinstance(block, DictConfig):
            continue
        kind = next((k for k in block if k in KINDS), None)
        if kind is None:
            continue
        instances[str(name)] = {"kind": kind, "url": client._resolve_base_url(str(name))}
    print(json.dumps({"head_server": dict(cfg["head_server"]), "instances": instances}))


main()
