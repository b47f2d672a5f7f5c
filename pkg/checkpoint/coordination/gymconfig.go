package coordination

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// Discovery from NeMo Gym's global config, as upstream's coordination
// does it (nemo_gym/_checkpoint/coordination.py @ 05bf55ac50b5, discover):
// every top-level entry that is a mapping holding one of the server types
// is a server, probed at its checkpoint status route; its name resolves to
// http://<host>:<port> of the first value of the entry's first value, as
// ServerClient._resolve_base_url resolves it (nemo_gym/server_utils.py and
// get_first_server_config_dict in nemo_gym/global_config.py, nemo-gym
// 0.7.0 on PyPI).

// GymServerTypes are the keys that make a top-level entry of Gym's global
// config a server (coordination.py _SERVER_TYPES).
var GymServerTypes = []string{"environment_servers", "responses_api_models", "responses_api_agents", "resources_servers"}

// GymConfigRoute is the head server's route serving the global config
// (server_utils.py, HeadServer): a JSON string holding YAML
// (OmegaConf.to_yaml), which ServerClient.load_from_global_config reads
// with json.loads and then OmegaConf.create.
const GymConfigRoute = "/global_config_dict_yaml"

// EndpointsFromGymConfig lists the servers of a Gym global config, in the
// config's order. doc is the YAML (or JSON) of the config itself, as a
// file holds it or as the head server's reply decodes to.
func EndpointsFromGymConfig(doc []byte) ([]Endpoint, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(doc, &root); err != nil {
		return nil, fmt.Errorf("gym config: %w", err)
	}
	if len(root.Content) == 0 {
		return nil, errors.New("gym config: empty")
	}
	top := root.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, errors.New("gym config: not a mapping of server names")
	}
	var out []Endpoint
	for i := 0; i+1 < len(top.Content); i += 2 {
		name, entry := top.Content[i].Value, top.Content[i+1]
		if entry.Kind != yaml.MappingNode || !holdsServerType(entry) {
			continue
		}
		url, err := firstServerURL(entry)
		if err != nil {
			return nil, fmt.Errorf("gym config: server %s: %w", name, err)
		}
		out = append(out, Endpoint{Name: name, URL: url})
	}
	if len(out) == 0 {
		return nil, errors.New("gym config: names no server (no entry holds " + strings.Join(GymServerTypes, ", ") + ")")
	}
	return out, nil
}

func holdsServerType(entry *yaml.Node) bool {
	for i := 0; i+1 < len(entry.Content); i += 2 {
		for _, t := range GymServerTypes {
			if entry.Content[i].Value == t {
				return true
			}
		}
	}
	return false
}

// firstServerURL is get_first_server_config_dict's host and port: the
// first value of the entry, then its first value.
func firstServerURL(entry *yaml.Node) (string, error) {
	level := entry
	for range 2 {
		if level.Kind != yaml.MappingNode || len(level.Content) < 2 {
			return "", errors.New("no server configuration under it")
		}
		level = level.Content[1]
	}
	if level.Kind != yaml.MappingNode {
		return "", errors.New("its server configuration is not a mapping")
	}
	var host, port string
	for i := 0; i+1 < len(level.Content); i += 2 {
		switch level.Content[i].Value {
		case "host":
			host = level.Content[i+1].Value
		case "port":
			port = level.Content[i+1].Value
		}
	}
	if host == "" {
		return "", errors.New("no host")
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", fmt.Errorf("port %q is not a port", port)
	}
	return "http://" + host + ":" + port, nil
}

// GymCheckpointToken is the bearer token of a Gym global config's
// checkpoint: block (nemo_gym/_checkpoint/settings.py @ 7f40a593c741,
// checkpoint_settings: enabled, control_auth_token, lease_grace_seconds),
// the token Gym's own controllers take (collection.py
// CollectionCheckpointer). It is "" when the block is absent or
// checkpointing is off, and an error when it is on without a token, as
// Gym's settings refuse it.
func GymCheckpointToken(doc []byte) (string, error) {
	var cfg struct {
		Checkpoint *struct {
			Enabled          bool   `yaml:"enabled"`
			ControlAuthToken string `yaml:"control_auth_token"`
		} `yaml:"checkpoint"`
	}
	if err := yaml.Unmarshal(doc, &cfg); err != nil {
		return "", fmt.Errorf("gym config: %w", err)
	}
	switch c := cfg.Checkpoint; {
	case c == nil || !c.Enabled:
		return "", nil
	case c.ControlAuthToken == "":
		return "", errors.New("gym config: checkpoint.control_auth_token is required when checkpoint.enabled is true")
	default:
		return c.ControlAuthToken, nil
	}
}

// FetchGymConfig reads the global config from a Gym head server at
// headURL (http://host:port), as ServerClient.load_from_global_config
// does, and returns the YAML it holds.
func FetchGymConfig(ctx context.Context, client *http.Client, headURL string) ([]byte, error) {
	if client == nil {
		client = newClient(httpconf.Config{})
	}
	rep, err := httpclient.Do(ctx, client, http.MethodGet, strings.TrimRight(headURL, "/")+GymConfigRoute, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("gym head server %s: %w", headURL, err)
	}
	if err := rep.Err("gym head server " + GymConfigRoute); err != nil {
		return nil, err
	}
	var doc string
	if err := codec.Unmarshal(rep.Body, &doc); err != nil {
		return nil, fmt.Errorf("gym head server %s%s: not a JSON string of the config's YAML: %s", headURL, GymConfigRoute, codec.DescribeError(err))
	}
	return []byte(doc), nil
}
