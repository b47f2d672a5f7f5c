package interoptest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// GymEnv is the pinned gym environment (scripts/pyenv.sh gym): nemo-gym and
// its servers' code, installed from tests/interop/envs/gym.
type GymEnv struct {
	// Dir is the environment; Python its interpreter.
	Dir, Python string
	// SitePackages is where nemo_gym and Gym's server directories
	// (resources_servers/, responses_api_models/, …) are installed.
	SitePackages string
}

// OpenGymEnv checks that the environment in dir imports nemo_gym and finds
// where it is installed.
func OpenGymEnv(dir string) (*GymEnv, error) {
	python := filepath.Join(dir, "bin", "python")
	out, err := exec.Command(python, "-c", "import nemo_gym, os; print(os.path.dirname(os.path.dirname(nemo_gym.__file__)))").Output()
	if err != nil {
		return nil, fmt.Errorf("the gym environment %s cannot import nemo_gym: %w", dir, err)
	}
	return &GymEnv{Dir: dir, Python: python, SitePackages: strings.TrimSpace(string(out))}, nil
}

// GymServer is one of Gym's server processes.
type GymServer struct {
	Name string
	Port int
	Proc *Process
}

// URL is the server's base URL.
func (g *GymServer) URL() string { return "http://127.0.0.1:" + strconv.Itoa(g.Port) }

// StartServer starts instance name of the global config doc, whose
// implementation lives in SitePackages/dir (e.g.
// responses_api_models/vllm_model), as Gym's RunHelper starts it
// (nemo_gym/cli/env.py _start: `python app.py` in the server's directory
// with the whole global config in NEMO_GYM_CONFIG_DICT and the instance
// name in NEMO_GYM_CONFIG_PATH), on the environment's interpreter rather
// than a uv venv per server. env is added to the process's environment.
func (e *GymEnv) StartServer(t *testing.T, name, dir string, port int, doc []byte, env ...string) *GymServer {
	t.Helper()
	environ := append([]string{"NEMO_GYM_CONFIG_DICT=" + string(doc), "NEMO_GYM_CONFIG_PATH=" + name, "PYTHONUNBUFFERED=1"}, env...)
	g := &GymServer{Name: name, Port: port}
	g.Proc = StartProcess(t, name, filepath.Join(e.SitePackages, dir), environ, e.Python, "app.py")
	return g
}

// WaitGymServers waits until every server answers GET / (Gym's liveness
// route), failing the test if one exits first or none answers in time.
func WaitGymServers(t *testing.T, servers ...*GymServer) {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for _, g := range servers {
		for !live(g.URL()) {
			select {
			case <-g.Proc.Done():
				t.Fatalf("Gym server %s exited before answering:\n%s", g.Name, g.Proc.Tail())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("Gym server %s did not answer GET / in time:\n%s", g.Name, g.Proc.Tail())
			}
			WaitTick()
		}
	}
}

func live(base string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

// VLLMModelConfig is the global config Gym's vllm_model is started with,
// configured as NeMo RL's training runs configure it: the installed
// package's responses_api_models/vllm_model/configs/vllm_model_for_training.yaml
// (token ids returned, the reasoning parser on), its policy placeholders
// filled with backend (a base URL ending in /v1) and model, served under
// the instance name on 127.0.0.1:port.
func (e *GymEnv) VLLMModelConfig(name string, port int, backend, model string) ([]byte, error) {
	path := filepath.Join(e.SitePackages, "responses_api_models", "vllm_model", "configs", "vllm_model_for_training.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var file map[string]map[string]map[string]map[string]any
	if err := yaml.Unmarshal(b, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	inner := file["policy_model"]["responses_api_models"]["vllm_model"]
	if inner == nil {
		return nil, fmt.Errorf("%s has no policy_model.responses_api_models.vllm_model: %s", path, b)
	}
	fill := map[string]any{"${policy_base_url}": []string{backend}, "${policy_api_key}": "dummy_key", "${policy_model_name}": model}
	for k, v := range inner {
		if s, ok := v.(string); ok {
			if r, ok := fill[s]; ok {
				inner[k] = r
			}
		}
	}
	inner["host"], inner["port"] = "127.0.0.1", port
	return yaml.Marshal(map[string]any{
		"head_server": map[string]any{"host": "127.0.0.1", "port": port},
		"dry_run":     false,
		name:          map[string]any{"responses_api_models": map[string]any{"vllm_model": inner}},
	})
}
