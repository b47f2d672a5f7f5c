package deploycheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/servers/agent"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
)

// prometheusSeries are the series Prometheus itself adds to every target.
var prometheusSeries = []string{"up", "scrape_duration_seconds", "scrape_samples_scraped"}

// registries builds every server of the local fleet (configs/*.yaml, with
// checkpointing on, as in the cluster) with a registry each, and returns
// the registries. Building registers every metric; nothing listens.
func registries(t *testing.T) []*prometheus.Registry {
	t.Helper()
	root := repoRoot(t)
	dir := t.TempDir()
	env := map[string]string{
		"GYMFLEET_CHECKPOINT_ENABLED": "true", "GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN": "t",
		"GYMFLEET_CHECKPOINT_ROOT": filepath.Join(dir, "checkpoints"), "GYMFLEET_CAPTURE_DIR": filepath.Join(dir, "capture"),
	}
	getenv := func(k string) string { return env[k] }
	flags := func(name string) configload.Flags {
		return configload.Flags{Config: filepath.Join(root, "configs", name+".yaml")}
	}
	var regs []*prometheus.Registry
	var closers []func(context.Context) error
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, c := range closers {
			if err := c(ctx); err != nil {
				t.Error(err)
			}
		}
	})
	reg := func() *prometheus.Registry {
		r := prometheus.NewRegistry()
		regs = append(regs, r)
		return r
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	mc, err := lifecycle.LoadConfig(flags("modelserver"), getenv, modelproxy.DefaultConfig(), nil)
	must(err)
	m, err := modelproxy.New(mc, modelproxy.Deps{Registry: reg()})
	must(err)
	closers = append(closers, m.Close)

	ec, err := lifecycle.LoadConfig(flags("envserver"), getenv, environment.DefaultConfig(), nil)
	must(err)
	e, err := environment.New(ec, environment.Deps{Registry: reg()})
	must(err)
	closers = append(closers, e.Close)

	ac, err := lifecycle.LoadConfig(flags("agentserver"), getenv, agent.DefaultProcessConfig(), nil)
	must(err)
	for _, c := range ac.AgentConfigs() {
		a, err := agent.New(c, agent.Deps{Registry: reg()})
		must(err)
		closers = append(closers, a.Close)
	}

	rc, err := lifecycle.LoadConfig(flags("resourceserver"), getenv, resources.DefaultProcessConfig(), nil)
	must(err)
	for _, c := range rc.ServerConfigs() {
		r, err := resources.New(c, resources.Deps{Registry: reg()})
		must(err)
		closers = append(closers, r.Close)
	}

	fc, err := lifecycle.LoadConfig(flags("fakeinference"), getenv, fakeinference.DefaultConfig(), nil)
	must(err)
	f, err := fakeinference.New(fc, fakeinference.Deps{Registry: reg()})
	must(err)
	closers = append(closers, f.Close)
	return regs
}

// registered reports whether a metric family named name is registered in
// reg. A vector without children is in no Gather, so ask the registry's
// own collision check: registering a descriptor of the same name with
// another help text fails only if the name is taken.
func registered(reg *prometheus.Registry, name string) bool {
	p := probe{prometheus.NewDesc(name, "deploycheck probe", nil, nil)}
	err := reg.Register(p)
	if err == nil {
		reg.Unregister(p)
		return false
	}
	return strings.Contains(err.Error(), "previously registered descriptor with the same fully-qualified name")
}

type probe struct{ desc *prometheus.Desc }

func (p probe) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }
func (p probe) Collect(chan<- prometheus.Metric)    {}

// exported reports whether some server exports series named name: a
// family's own name, or a histogram's or summary's _bucket, _sum, _count.
func exported(regs []*prometheus.Registry, name string) bool {
	candidates := []string{name}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			candidates = append(candidates, base)
		}
	}
	for _, reg := range regs {
		for _, c := range candidates {
			if registered(reg, c) {
				return true
			}
		}
	}
	return slices.Contains(prometheusSeries, name)
}

// metricNames lists the metric names an expression selects.
func metricNames(expr parser.Expr) []string {
	var names []string
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		names = append(names, name)
		return nil
	})
	return names
}

func promqlParser() parser.Parser { return parser.NewParser(parser.Options{}) }

func TestRegistered_TellsRegisteredFromUnregistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"a"}))
	if !registered(reg, "x_total") {
		t.Error("a vector without children is registered")
	}
	if registered(reg, "y_total") {
		t.Error("y_total is not registered")
	}
	if registered(reg, "y_total") {
		t.Error("the probe of y_total stayed registered")
	}
}

// TestAlertRules parses the rules with Prometheus's own rule-file loader
// (unknown fields refused, every expression and template checked), and
// checks that they select only metrics the servers export and that the
// alerts operators rely on are there.
func TestAlertRules(t *testing.T) {
	path := filepath.Join(repoRoot(t), "deploy", "monitoring", "gymfleet-alerts.yaml")
	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(content, false, model.UTF8Validation, promqlParser(), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("%s: %v", path, errors.Join(errs...))
	}
	regs := registries(t)
	alerts := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			expr, err := promqlParser().ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", r.Alert, err)
				continue
			}
			for _, name := range metricNames(expr) {
				if !exported(regs, name) {
					t.Errorf("alert %s selects %s, which no server exports", r.Alert, name)
				}
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("alert %s: want a severity label and a summary", r.Alert)
			}
		}
	}
	for _, want := range []string{"GymfleetCheckpointLeaseExpired", "GymfleetCheckpointStuck", "GymfleetRestoreFailed", "GymfleetServerDown", "GymfleetReplicaLost"} {
		if !alerts[want] {
			t.Errorf("no alert %s", want)
		}
	}
}

// dashboard is the part of Grafana's dashboard model the file uses;
// decoding refuses any other field, so a misspelt one fails.
type dashboard struct {
	UID          string                    `json:"uid"`
	Title        string                    `json:"title"`
	Description  string                    `json:"description"`
	Tags         []string                  `json:"tags"`
	Timezone     string                    `json:"timezone"`
	Schema       int                       `json:"schemaVersion"`
	Version      int                       `json:"version"`
	Editable     bool                      `json:"editable"`
	Refresh      string                    `json:"refresh"`
	GraphTooltip int                       `json:"graphTooltip"`
	Time         struct{ From, To string } `json:"time"`
	Templating   struct {
		List []struct {
			Name    string         `json:"name"`
			Label   string         `json:"label"`
			Type    string         `json:"type"`
			Query   string         `json:"query"`
			Current map[string]any `json:"current"`
			Hide    int            `json:"hide"`
		} `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []any `json:"list"`
	} `json:"annotations"`
	Panels []panel `json:"panels"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int         `json:"id"`
	Type        string      `json:"type"`
	Title       string      `json:"title"`
	Description string      `json:"description"`
	Collapsed   bool        `json:"collapsed"`
	Datasource  *datasource `json:"datasource"`
	GridPos     struct {
		H, W, X, Y int
	} `json:"gridPos"`
	FieldConfig map[string]any `json:"fieldConfig"`
	Options     map[string]any `json:"options"`
	Panels      []panel        `json:"panels"`
	Targets     []struct {
		RefID        string      `json:"refId"`
		Datasource   *datasource `json:"datasource"`
		Expr         string      `json:"expr"`
		LegendFormat string      `json:"legendFormat"`
	} `json:"targets"`
}

// grafanaVariables stand for Grafana's variables in a query, so that the
// query parses as the PromQL Grafana sends.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$job", "gymfleet")

// TestDashboard decodes the dashboard strictly, checks its layout, parses
// every panel's queries and checks that they select only metrics the
// servers export, and that the panels the issue asks for are there.
func TestDashboard(t *testing.T) {
	path := filepath.Join(repoRoot(t), "deploy", "monitoring", "gymfleet-dashboard.json")
	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(content))
	dec.DisallowUnknownFields()
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if d.UID == "" || d.Title == "" || d.Schema == 0 {
		t.Errorf("uid %q, title %q, schemaVersion %d: all are needed to import it", d.UID, d.Title, d.Schema)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	regs := registries(t)
	ids := map[int]bool{}
	var titles []string
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d is used twice", p.ID)
			}
			ids[p.ID] = true
			titles = append(titles, p.Title)
			if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: gridPos %+v is outside Grafana's 24 columns", p.Title, p.GridPos)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			if p.Datasource == nil || p.Datasource.Type != "prometheus" || !vars[strings.Trim(p.Datasource.UID, "${}")] {
				t.Errorf("panel %q: datasource %+v, want prometheus by the dashboard's datasource variable", p.Title, p.Datasource)
			}
			for _, q := range p.Targets {
				expr, err := promqlParser().ParseExpr(grafanaVariables.Replace(q.Expr))
				if err != nil {
					t.Errorf("panel %q query %s: %v", p.Title, q.RefID, err)
					continue
				}
				for _, name := range metricNames(expr) {
					if !exported(regs, name) {
						t.Errorf("panel %q selects %s, which no server exports", p.Title, name)
					}
				}
			}
		}
	}
	walk(d.Panels)
	for _, want := range []string{"Checkpoint duration by stage", "Checkpoint blockers", "Rollouts in flight per kind", "Proxy latency", "Capture ledger size"} {
		if !slices.ContainsFunc(titles, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("no panel %q", want)
		}
	}
}
