package modelproxy

import (
	"io"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// worker is one inference worker of upstream.base_urls (or base_url).
type worker struct {
	chatURL, modelsURL, root string
	outstanding              prometheus.Gauge
	failures, failovers      prometheus.Counter
}

// newWorkers builds the workers of cfg and registers their series, labelled
// by base URL (bounded: the configuration lists them).
func newWorkers(cfg Config, reg prometheus.Registerer) []worker {
	outstanding := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gymfleet_model_worker_outstanding_calls",
		Help: "Upstream calls outstanding on each inference worker.",
	}, []string{"worker"})
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gymfleet_model_worker_failures_total",
		Help: "Upstream calls an inference worker failed (it is passed over for a short backoff).",
	}, []string{"worker"})
	failovers := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gymfleet_model_worker_failovers_total",
		Help: "Upstream calls an inference worker did not take (never processed, or a continuation it refused) that went on to another worker.",
	}, []string{"worker"})
	reg.MustRegister(outstanding, failures, failovers)
	bases := cfg.Upstream.Workers()
	ws := make([]worker, len(bases))
	for i, b := range bases {
		ws[i] = worker{
			chatURL: b + "/chat/completions", modelsURL: b + "/models", root: workerRoot(b),
			outstanding: outstanding.WithLabelValues(b), failures: failures.WithLabelValues(b), failovers: failovers.WithLabelValues(b),
		}
	}
	return ws
}

// acquire picks a worker for a call of key and counts it outstanding; see
// workerPicker.pick.
func (s *Server) acquire(key string, tried []bool) (int, bool) {
	i, ok := s.picker.pick(key, tried)
	if ok {
		s.workers[i].outstanding.Inc()
	}
	return i, ok
}

// releaseWorker ends a call acquire counted.
func (s *Server) releaseWorker(i int) {
	s.picker.done(i)
	s.workers[i].outstanding.Dec()
}

// workerFailed passes worker i over for the backoff.
func (s *Server) workerFailed(i int) {
	s.picker.fail(i)
	s.workers[i].failures.Inc()
}

// releaseOnClose ends a worker's outstanding call when the reply's body is
// closed (a stream is outstanding until it ends).
type releaseOnClose struct {
	io.ReadCloser
	once    sync.Once
	release func()
}

func (r *releaseOnClose) Close() error {
	err := r.ReadCloser.Close()
	r.once.Do(r.release)
	return err
}

// holdUntilClosed wraps resp's body so that closing it releases worker i.
func (s *Server) holdUntilClosed(resp *http.Response, i int) {
	resp.Body = &releaseOnClose{ReadCloser: resp.Body, release: func() { s.releaseWorker(i) }}
}
