package fakeinference

import "github.com/prometheus/client_golang/prometheus"

// metrics live on the server's own registry.
type metrics struct {
	calls  *prometheus.CounterVec
	tokens *prometheus.CounterVec
	held   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_fakeinference_calls_total",
			Help: "Chat calls that ended, by status: returned, cut, failed, or rejected (refused with a 4xx before admission).",
		}, []string{"status"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_fakeinference_tokens_total",
			Help: "Tokens processed: kind=prompt for admitted calls' prompts, kind=generation for tokens generated (continued prefixes excluded).",
		}, []string{"kind"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gymfleet_fakeinference_held_calls",
			Help: "Calls waiting on a /_ctl/hold.",
		}),
	}
	reg.MustRegister(m.calls, m.tokens, m.held)
	return m
}
