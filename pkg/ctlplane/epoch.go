package ctlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// EpochHeader carries the sender's epoch on every call between the fleet's
// servers and on every reply of their data routes.
const EpochHeader = "X-Gym-Epoch"

// DefaultEpochFileName is the epoch file's name beneath the checkpoint root
// when checkpoint.epoch_file is not set.
const DefaultEpochFileName = "EPOCH"

// epochState fences incarnations. Each restore the coordinator drives
// carries an epoch higher than any the fleet has had; the participants
// persist it in the epoch file every server of the fleet reads, and adopt
// it. A process that was paused (SIGSTOP, a long stall) while its
// replacement was restored still holds the earlier epoch: its peers refuse
// its calls (lower epoch in the header), it refuses its own replies and
// durable writes once the file names a later epoch, and from then on it
// refuses everything (fenced), so it cannot finish an episode twice.
type epochState struct {
	path string
	// cur is this process's epoch; fenced is set, never cleared, once a
	// later epoch is seen.
	cur    atomic.Uint64
	fenced atomic.Bool
	// mu serialises raises of the file by this process.
	mu sync.Mutex
}

func newEpochState(path string) (*epochState, error) {
	e := &epochState{path: path}
	n, err := readEpochFile(path)
	if err != nil {
		return nil, err
	}
	e.cur.Store(n)
	return e, nil
}

// readEpochFile reads the fleet's epoch; a missing file is epoch 0, and so
// is no file at all (an s3:// root without checkpoint.epoch_file: peers
// still fence by the header, the process itself keeps its epoch in memory).
func readEpochFile(path string) (uint64, error) {
	if path == "" {
		return 0, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("checkpoint epoch file: %w", err)
	}
	text := strings.TrimSpace(string(b))
	if text == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("checkpoint epoch file %s: %w", path, err)
	}
	return n, nil
}

// staleErr is the refusal of a process whose epoch was superseded.
func (e *epochState) staleErr(later uint64) error {
	if later == 0 {
		return apierror.New(apierror.StaleEpoch, "this process is of epoch %d, which a restore superseded; it serves nothing more", e.cur.Load())
	}
	return apierror.New(apierror.StaleEpoch, "this process is of epoch %d and the fleet was restored into epoch %d; it serves nothing more", e.cur.Load(), later)
}

// check reads the epoch file and fences this process if it names a later
// epoch. An unreadable file fails the check only when strict (a durable
// write); a reply is not held hostage to a storage hiccup.
func (e *epochState) check(strict bool) error {
	if e.fenced.Load() {
		return e.staleErr(0)
	}
	n, err := readEpochFile(e.path)
	if err != nil {
		if strict {
			return apierror.Wrap(apierror.Internal, err)
		}
		return nil
	}
	if n > e.cur.Load() {
		e.fenced.Store(true)
		return e.staleErr(n)
	}
	return nil
}

// raise moves this process's epoch up to n (never down).
func (e *epochState) raise(n uint64) {
	for {
		cur := e.cur.Load()
		if n <= cur || e.cur.CompareAndSwap(cur, n) {
			return
		}
	}
}

// adopt moves this process to epoch n (a restore's) and raises the file to
// it. A lower n than the file's is a stale controller's and is refused.
func (e *epochState) adopt(n uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fenced.Load() {
		return e.staleErr(0)
	}
	onFile, err := readEpochFile(e.path)
	if err != nil {
		return apierror.Wrap(apierror.Internal, err)
	}
	if n == 0 {
		// A controller that mints no epoch (the reference's): join the
		// fleet's current one.
		n = onFile
	}
	if n < onFile {
		return apierror.New(apierror.StaleEpoch, "restore into epoch %d, but the fleet is already at epoch %d", n, onFile)
	}
	if n < e.cur.Load() {
		return apierror.New(apierror.StaleEpoch, "restore into epoch %d, but this process is already at epoch %d", n, e.cur.Load())
	}
	if n > onFile && e.path != "" {
		if err := os.MkdirAll(filepath.Dir(e.path), 0o755); err != nil {
			return apierror.Wrap(apierror.Internal, fmt.Errorf("checkpoint epoch file: %w", err))
		}
		if err := atomicfile.WriteFile(atomicfile.OS, e.path, []byte(strconv.FormatUint(n, 10)+"\n")); err != nil {
			return apierror.Wrap(apierror.Internal, fmt.Errorf("checkpoint epoch file: %w", err))
		}
	}
	e.raise(n)
	return nil
}

// Epoch is this process's epoch.
func (c *Controller) Epoch() uint64 { return c.epoch.cur.Load() }

// Fenced reports whether this process has seen a later epoch than its own.
func (c *Controller) Fenced() bool { return c.epoch.fenced.Load() }

// CheckEpoch reads the fleet's epoch file and refuses with stale_epoch if
// a restore has moved the fleet past this process. Durable writes (the
// capture ledger's appends) call it right before writing.
func (c *Controller) CheckEpoch() error {
	err := c.epoch.check(true)
	if err != nil && apierror.HasCode(err, apierror.StaleEpoch) {
		c.metrics.refusal(apierror.StaleEpoch)
	}
	return err
}

// peerEpoch refuses a request whose epoch header differs from this
// process's: a lower one is a zombie's call; a higher one means this
// process is the zombie (confirmed against the file, then fenced).
func (c *Controller) peerEpoch(h http.Header) error {
	if c.epoch.fenced.Load() {
		return c.epoch.staleErr(0)
	}
	v := h.Get(EpochHeader)
	if v == "" {
		// A caller outside the fleet (a trainer, a test, NeMo Gym's
		// servers) cannot vouch for this process: the file can, before
		// any work (a model call) starts.
		return c.epoch.check(false)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return apierror.New(apierror.InvalidRequest, "%s %q is not an epoch", EpochHeader, v)
	}
	own := c.epoch.cur.Load()
	switch {
	case n < own:
		return apierror.New(apierror.StaleEpoch, "the caller is of epoch %d and this fleet of epoch %d", n, own)
	case n > own:
		if err := c.epoch.check(false); err != nil {
			return err
		}
		if now := c.epoch.cur.Load(); n != now {
			return apierror.New(apierror.StaleEpoch, "the caller claims epoch %d, and the fleet's is %d", n, now)
		}
	}
	return nil
}

// exemptFromEpoch lists the routes a fenced process still answers: the
// control API (whose writes check the epoch themselves) and the probes.
func exemptFromEpoch(r *http.Request) bool {
	p := r.URL.Path
	return strings.HasPrefix(p, RoutePrefix+"/") || strings.HasPrefix(p, ReferenceRoutePrefix+"/") ||
		p == "/healthz" || p == "/readyz" || p == "/metrics" || p == "/"
}

// epochWriter holds a data reply until the epoch file has been checked:
// a process that a restore superseded replaces its reply by stale_epoch,
// so a caller never accepts a result a zombie produced.
type epochWriter struct {
	http.ResponseWriter
	c       *Controller
	r       *http.Request
	decided bool
	refused bool
}

func (w *epochWriter) decide() bool {
	if w.decided {
		return !w.refused
	}
	w.decided = true
	if err := w.c.epoch.check(false); err != nil {
		w.refused = true
		w.c.metrics.refusal(apierror.StaleEpoch)
		h := w.ResponseWriter.Header()
		for k := range h {
			delete(h, k)
		}
		apierror.Write(w.ResponseWriter, w.r, nil, err)
		return false
	}
	w.ResponseWriter.Header().Set(EpochHeader, strconv.FormatUint(w.c.epoch.cur.Load(), 10))
	return true
}

func (w *epochWriter) WriteHeader(status int) {
	if w.decide() {
		w.ResponseWriter.WriteHeader(status)
	}
}

func (w *epochWriter) Write(b []byte) (int, error) {
	if !w.decide() {
		return 0, errFencedReply
	}
	return w.ResponseWriter.Write(b)
}

func (w *epochWriter) Flush() {
	if w.decided && w.refused {
		return
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *epochWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

var errFencedReply = errors.New("ctlplane: reply refused, this process's epoch was superseded")

// Client returns a client that stamps this process's epoch on every
// request to a peer and refuses a peer's reply of another epoch, on c's
// transport and connections.
func (c *Controller) Client(hc *http.Client) *http.Client {
	out := *hc
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	out.Transport = &epochTransport{base: base, c: c}
	return &out
}

type epochTransport struct {
	base http.RoundTripper
	c    *Controller
}

func (t *epochTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.c.epoch.fenced.Load() {
		closeReqBody(req)
		return refusal(req, t.c.epoch.staleErr(0)), nil
	}
	own := t.c.epoch.cur.Load()
	r2 := req.Clone(req.Context())
	r2.Header.Set(EpochHeader, strconv.FormatUint(own, 10))
	resp, err := t.base.RoundTrip(r2)
	if err != nil {
		return resp, err
	}
	if v := resp.Header.Get(EpochHeader); v != "" {
		n, perr := strconv.ParseUint(v, 10, 64)
		var refuse error
		switch {
		case perr != nil:
			refuse = apierror.New(apierror.StaleEpoch, "the peer's reply carries %s %q, not an epoch", EpochHeader, v)
		case n < own:
			refuse = apierror.New(apierror.StaleEpoch, "the peer's reply is of epoch %d and this fleet of epoch %d", n, own)
		case n > own:
			refuse = t.c.epoch.check(false)
			if now := t.c.epoch.cur.Load(); refuse == nil && n != now {
				refuse = apierror.New(apierror.StaleEpoch, "the peer's reply claims epoch %d, and the fleet's is %d", n, now)
			}
		}
		if refuse != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
			_ = resp.Body.Close()
			t.c.metrics.refusal(apierror.StaleEpoch)
			return refusal(req, refuse), nil
		}
	}
	return resp, nil
}

func (t *epochTransport) CloseIdleConnections() {
	if ci, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

func closeReqBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// refusal is a stale_epoch reply made locally, in the fleet's envelope,
// so a caller handles it as any refusal of its peer.
func refusal(req *http.Request, err error) *http.Response {
	e := apierror.From(err)
	b, _ := codec.MarshalStable(apierror.Envelope{Error: apierror.Body{Code: e.Code, Detail: e.Detail}})
	return &http.Response{
		Status: fmt.Sprintf("%d %s", e.HTTPStatus(), http.StatusText(e.HTTPStatus())), StatusCode: e.HTTPStatus(),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(b)),
		ContentLength: int64(len(b)),
		Request:       req,
	}
}
