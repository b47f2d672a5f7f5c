package ctlplane

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
)

type metrics struct {
	ops           *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	records       *prometheus.CounterVec
	bytes         *prometheus.CounterVec
	refusals      *prometheus.CounterVec
	leaseExpiries prometheus.Counter
	notReady      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, c *Controller) *metrics {
	m := &metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_ckpt_operations_total",
			Help: "Checkpoint control operations, by operation and outcome (ok, refused, error).",
		}, []string{"op", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gymfleet_ckpt_operation_duration_seconds",
			Help:    "Time spent in checkpoint control operations, by operation.",
			Buckets: []float64{.001, .005, .02, .1, .5, 1, 3, 10, 60},
		}, []string{"op"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_ckpt_records_total",
			Help: "Checkpoint records written (commit) or read (restore).",
		}, []string{"op"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_ckpt_bytes_total",
			Help: "Bytes of checkpoint records written (commit) or read (restore).",
		}, []string{"op"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_ckpt_refusals_total",
			Help: "Control and data requests refused by the control plane, by error code.",
		}, []string{"code"}),
		leaseExpiries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gymfleet_ckpt_lease_expiries_total",
			Help: "Checkpoints reopened because their lease expired.",
		}),
		notReady: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gymfleet_ckpt_prepares_not_ready_total",
			Help: "Prepares that reached their deadline before the participant was ready.",
		}),
	}
	phase := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gymfleet_ckpt_phase",
		Help: "Current checkpoint phase: 0 idle, 1 preparing, 2 prepared, 3 committed, 4 restored.",
	}, func() float64 {
		p, _ := c.Phase()
		return float64(p)
	})
	// Read live from the participant while a prepare waits (Report is cheap
	// and callable at any time), so a stuck checkpoint shows what holds it.
	blockers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gymfleet_ckpt_blockers",
		Help: "Episodes keeping this participant's open checkpoint from being prepared (0 unless preparing).",
	}, func() float64 {
		if p, _ := c.Phase(); p != PhasePreparing {
			return 0
		}
		return float64(c.p.Report(0).BlockerCount)
	})
	reg.MustRegister(m.ops, m.duration, m.records, m.bytes, m.refusals, m.leaseExpiries, m.notReady, phase, blockers)
	return m
}

// observe counts one operation and its duration.
func (m *metrics) observe(op string, start time.Time, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
		code := apierror.CodeOf(err)
		if s := apierror.Status(code); s >= 400 && s < 500 {
			outcome = "refused"
			m.refusal(code)
		}
	}
	m.ops.WithLabelValues(op, outcome).Inc()
	m.duration.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

func (m *metrics) refusal(code apierror.Code) { m.refusals.WithLabelValues(string(code)).Inc() }
