package ctlplane

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Mount adds the control routes under both prefixes.
func (c *Controller) Mount(r chi.Router) {
	r.Mount(RoutePrefix, c.Routes())
	r.Mount(ReferenceRoutePrefix, c.Routes())
}

// Routes is the control API, bearer-protected.
func (c *Controller) Routes() chi.Router {
	r := chi.NewRouter()
	r.Use(c.auth)
	r.Get("/status", c.handle("status", func(r *http.Request) (any, error) { return c.Status(), nil }))
	r.Post("/prepare", c.handle("prepare", func(r *http.Request) (any, error) {
		var req CheckpointRequest
		if err := httpserver.DecodeJSONStrict(r, &req); err != nil {
			return nil, err
		}
		rep, err := c.Prepare(r.Context(), req)
		if rep != nil {
			annotate(r, req.CheckpointID, rep.Phase, tracing.AttrBlockers.Int(rep.Report.BlockerCount))
		}
		return rep, err
	}))
	r.Post("/renew", c.handle("renew", func(r *http.Request) (any, error) {
		var req CheckpointRequest
		if err := httpserver.DecodeJSONStrict(r, &req); err != nil {
			return nil, err
		}
		return c.Renew(req)
	}))
	r.Post("/commit", c.handle("commit", func(r *http.Request) (any, error) {
		var req CommitRequest
		if err := httpserver.DecodeJSONStrict(r, &req); err != nil {
			return nil, err
		}
		episodes := len(req.EpisodeIDs)
		rep, err := c.commit(r.Context(), req, true)
		if rep != nil {
			annotate(r, req.CheckpointID, rep.Phase, tracing.AttrEpisodes.Int(episodes),
				tracing.AttrRecords.Int(rep.Records), tracing.AttrBytes.Int64(rep.Bytes))
		}
		return rep, err
	}))
	r.Post("/restore", c.handle("restore", func(r *http.Request) (any, error) {
		// The body names every episode to continue, and the process is
		// fresh (Tuning.RequestDecoding). Restore then starts the
		// checkpoint, which outlasts this.
		defer c.tuning.RequestDecoding()()
		var req RestoreRequest
		if err := httpserver.DecodeJSONStrict(r, &req); err != nil {
			return nil, err
		}
		episodes := len(req.EpisodeIDs)
		rep, err := c.restore(r.Context(), req, true)
		if rep != nil {
			annotate(r, req.CheckpointID, rep.Phase, tracing.AttrEpisodes.Int(episodes), tracing.AttrRecords.Int(rep.Records))
		}
		return rep, err
	}))
	r.Post("/resume", c.handle("resume", func(r *http.Request) (any, error) {
		var req CheckpointRequest
		if err := httpserver.DecodeJSONStrict(r, &req); err != nil {
			return nil, err
		}
		rep, err := c.Resume(req)
		if rep != nil {
			annotate(r, req.CheckpointID, rep.Phase)
		}
		return rep, err
	}))
	r.Post("/retire", c.handle("retire", func(r *http.Request) (any, error) {
		var req RetireRequest
		if err := httpserver.DecodeJSONStrict(r, &req); err != nil {
			return nil, err
		}
		annotate(r, req.CheckpointID, noPhase, tracing.AttrEpisodes.Int(len(req.EpisodeIDs)))
		return c.Retire(r.Context(), req)
	}))
	r.Post("/forget", c.handle("forget", func(r *http.Request) (any, error) {
		var req ForgetRequest
		if err := httpserver.DecodeJSONStrict(r, &req); err != nil {
			return nil, err
		}
		annotate(r, req.CheckpointID, noPhase, tracing.AttrRollouts.Int(len(req.RolloutIDs)))
		return c.Forget(r.Context(), req)
	}))
	return r
}

// asValidationError answers a control body that does not validate (not
// JSON, an unknown field, a bad id, a deadline or list out of range) with
// 422, as NeMo Gym's FastAPI routes answer every body their pydantic
// models refuse (control.py: each operation's body is its request model);
// the envelope and its invalid_request code stay ours.
func asValidationError(err error) error {
	var ae *apierror.Error
	if errors.As(err, &ae) && ae.Code == apierror.InvalidRequest && ae.HTTPStatus() != http.StatusUnprocessableEntity {
		return ae.WithStatus(http.StatusUnprocessableEntity)
	}
	return err
}

// noPhase is annotate's phase for replies that report none.
const noPhase Phase = 255

// annotate adds the checkpoint id, the phase a reply reports and counts to
// the operation's span.
func annotate(r *http.Request, checkpointID string, phase Phase, attrs ...attribute.KeyValue) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(tracing.AttrCheckpointID.String(checkpointID))
	if phase != noPhase {
		span.SetAttributes(tracing.AttrPhase.String(phase.String()))
	}
	span.SetAttributes(attrs...)
}

// handle wraps an operation with metrics, its gym.checkpoint.<op> span
// (not for status, which watchers poll) and the error envelope.
func (c *Controller) handle(op string, h httpserver.HandlerFunc) http.HandlerFunc {
	inner := httpserver.Handle(c.log, func(r *http.Request) (any, error) {
		v, err := h(r)
		return v, asValidationError(err)
	})
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &codeRecorder{ResponseWriter: w}
		var span trace.Span
		if op != "status" {
			var ctx context.Context
			ctx, span = c.tracer.Start(r.Context(), tracing.SpanCheckpointPrefix+op, trace.WithAttributes(
				tracing.AttrParticipantKind.String(c.p.Kind()), tracing.AttrInstance.String(c.p.Instance())))
			if span.IsRecording() {
				r = r.WithContext(ctx)
			}
		}
		inner(rec, r)
		var err error
		if rec.status >= 400 {
			err = apierror.New(rec.code(), "")
		}
		if span != nil {
			if err != nil {
				span.SetStatus(codes.Error, string(apierror.CodeOf(err)))
			}
			span.End()
		}
		if op != "status" {
			c.metrics.observe(op, start, err)
		}
	}
}

// codeRecorder remembers the status, to count refusals by code.
type codeRecorder struct {
	http.ResponseWriter
	status int
	body   []byte
}

func (r *codeRecorder) WriteHeader(s int) {
	r.status = s
	r.ResponseWriter.WriteHeader(s)
}

func (r *codeRecorder) Write(b []byte) (int, error) {
	if r.status >= 400 && len(r.body) < 4096 {
		r.body = append(r.body, b...)
	}
	return r.ResponseWriter.Write(b)
}

func (r *codeRecorder) code() apierror.Code {
	if e := apierror.Parse(r.status, r.body); e != nil {
		return e.Code
	}
	return apierror.Internal
}

func (c *Controller) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !httpserver.BearerMatches(r, c.cfg.ControlAuthToken) {
			c.metrics.refusal(apierror.Unauthorized)
			apierror.Write(w, r, nil, apierror.New(apierror.Unauthorized, "missing or wrong bearer token for the checkpoint control API"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Admission says what happens to a data request while a checkpoint holds
// admission closed.
type Admission uint8

const (
	// AdmitPass lets the request through; the participant decides (it may
	// hold or park the work itself).
	AdmitPass Admission = iota
	// AdmitWait holds the request until admission reopens. It is not "in
	// flight" while it waits.
	AdmitWait
	// AdmitRefuse answers 409 admission_closed; the caller resends it
	// unchanged after the checkpoint.
	AdmitRefuse
)

// Classifier tells the middleware which episode a data request belongs to
// (ok false: none) and how admission treats it.
type Classifier func(r *http.Request) (id rollout.EpisodeID, ok bool, a Admission)

// ByPrefix classifies by the /ng-rollout/<capture_key> prefix and admits
// every request with a.
func ByPrefix(a Admission) Classifier {
	return func(r *http.Request) (rollout.EpisodeID, bool, Admission) {
		id, ok := rollout.FromContext(r.Context())
		return id, ok, a
	}
}

// ErrorWriter answers a refused request in the shape of the server's
// routes.
type ErrorWriter func(w http.ResponseWriter, r *http.Request, err error)

// Middleware applies the attempt fence and admission to a server's data
// routes. It must run after the /ng-rollout prefix is stripped (it is, as
// httpserver.RouterOptions.Middleware). Its refusals are apierror.Write's.
func (c *Controller) Middleware(classify Classifier) func(http.Handler) http.Handler {
	return c.MiddlewareWith(classify, nil)
}

// MiddlewareWith is Middleware answering its refusals with write (nil:
// apierror.Write), for a server whose routes speak another error shape.
func (c *Controller) MiddlewareWith(classify Classifier, write ErrorWriter) func(http.Handler) http.Handler {
	if classify == nil {
		classify = ByPrefix(AdmitPass)
	}
	if write == nil {
		write = func(w http.ResponseWriter, r *http.Request, err error) { apierror.Write(w, r, nil, err) }
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !exemptFromEpoch(r) {
				if err := c.peerEpoch(r.Header); err != nil {
					c.metrics.refusal(apierror.StaleEpoch)
					write(w, r, err)
					return
				}
				w = &epochWriter{ResponseWriter: w, c: c, r: r, write: write}
			}
			id, named, adm := classify(r)
			if named {
				if err := c.CheckFence(id); err != nil {
					write(w, r, err)
					return
				}
			}
			switch adm {
			case AdmitRefuse:
				if closed, _ := c.gate.state(); closed {
					c.metrics.refusal(apierror.AdmissionClosed)
					write(w, r, apierror.New(apierror.AdmissionClosed, "a checkpoint is in progress; resend this request unchanged after it"))
					return
				}
			case AdmitWait:
				if closed, _ := c.gate.state(); closed {
					if err := readBodyFirst(r); err != nil {
						write(w, r, err)
						return
					}
				}
				if err := c.gate.wait(r.Context()); err != nil {
					write(w, r, err)
					return
				}
				// A retire may have run while this waited.
				if named {
					if err := c.CheckFence(id); err != nil {
						write(w, r, err)
						return
					}
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// readBodyFirst reads an HTTP/1.x request's body before the request waits
// for admission. net/http notices a client that hung up (its context ends)
// only once the body has been read; unread, a client that gave up while the
// checkpoint held its call (an SDK's timeout, then its retry) would still
// have its call sent upstream after the resume, to generate for nobody.
// HTTP/2 ends a stream's context when the client resets it, body or not.
func readBodyFirst(r *http.Request) error {
	if r.ProtoMajor >= 2 || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	b, err := httpserver.ReadBody(r)
	if err != nil {
		return err
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return nil
}
