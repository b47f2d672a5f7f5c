package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/control"
)

func runTop(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("top", stderr)
	config := fs.String("config", "configs/local.yaml", "fleet file")
	interval := fs.Duration("interval", 2*time.Second, "time between redraws")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *interval <= 0 {
		return errors.New("top: --interval must be positive")
	}
	cfg, err := fleet.Load(*config)
	if err != nil {
		return err
	}
	hc, err := fleetHTTP(cfg, getenv)
	if err != nil {
		return err
	}
	client := httpclient.New(httpclient.Options{H2C: true, MaxConnsPerHost: 2, HTTP: hc})
	defer client.CloseIdleConnections()
	tp := newTop(cfg.Endpoints(""), client)
	t := time.NewTicker(*interval)
	defer t.Stop()
	return watchLoop(ctx, stdout, isTerminal(stdout), t.C, tp.frame)
}

// top samples every endpoint's /metrics and shows, per server, the
// rollouts (or calls) in flight, requests per second since the last
// frame, and its checkpoint phase and operations.
type top struct {
	endpoints []fleet.Endpoint
	client    *http.Client
	// last are each endpoint's request count and when it was read.
	last map[string]sample
}

type sample struct {
	requests float64
	at       time.Time
}

func newTop(eps []fleet.Endpoint, client *http.Client) *top {
	return &top{endpoints: eps, client: client, last: map[string]sample{}}
}

// scrape reads an endpoint's metrics.
func (tp *top) scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rep, err := httpclient.Do(ctx, tp.client, http.MethodGet, strings.TrimRight(url, "/")+"/metrics", nil, nil)
	if err != nil {
		return nil, err
	}
	if err := rep.Err("GET /metrics"); err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(rep.Body))
}

// sum adds up every series of a counter or gauge; ok false if absent.
func sum(mfs map[string]*dto.MetricFamily, name string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
	var v float64
	for _, m := range mf.GetMetric() {
		v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return v, true
}

func (tp *top) frame(ctx context.Context) []byte {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER\tKIND\tIN FLIGHT\tREQ/S\tCKPT PHASE\tCKPT OPS")
	var totalInFlight, totalRate float64
	for _, e := range tp.endpoints {
		mfs, err := tp.scrape(ctx, e.URL)
		if err != nil {
			fmt.Fprintf(tw, "%s\t%s\tunreachable\t-\t-\t-\n", e.Name, e.Kind)
			delete(tp.last, e.Name)
			continue
		}
		inFlight := "-"
		for _, name := range []string{"gymfleet_rollouts_in_flight", "gymfleet_model_calls_in_flight", "gymfleet_resources_sessions", "gymfleet_fakeinference_held_calls"} {
			if v, ok := sum(mfs, name); ok {
				inFlight = fmt.Sprint(v)
				if name == "gymfleet_rollouts_in_flight" && e.Kind == control.KindEnvironment {
					totalInFlight += v
				}
				break
			}
		}
		now := time.Now()
		reqs, _ := sum(mfs, "gymfleet_http_requests_total")
		rate := "-"
		if prev, ok := tp.last[e.Name]; ok && now.After(prev.at) {
			r := (reqs - prev.requests) / now.Sub(prev.at).Seconds()
			rate = fmt.Sprintf("%.1f", r)
			totalRate += r
		}
		tp.last[e.Name] = sample{requests: reqs, at: now}
		phase, ops := "-", "-"
		if v, ok := sum(mfs, "gymfleet_ckpt_phase"); ok {
			phase = control.Phase(v).String()
			o, _ := sum(mfs, "gymfleet_ckpt_operations_total")
			ops = fmt.Sprint(o)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Name, e.Kind, inFlight, rate, phase, ops)
	}
	tw.Flush()
	fmt.Fprintf(&b, "\nrollouts in flight (environments): %g   requests/s (all servers): %.1f\n", totalInFlight, totalRate)
	return b.Bytes()
}
