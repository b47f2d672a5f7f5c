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
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
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
//
// A check followed by a write leaves a window: paused between the two, a
// process would write after its replacement's raise. Durable writes
// therefore run inside guard, under the epoch lock (epochlock.go), which a
// raise takes exclusively: the write either lands before the raise or is
// refused. Readers that accept what those writes leave (a restore, the
// ledger's import) need no check of their own.
type epochState struct {
	path string
	// cur is this process's epoch; fenced is set, never cleared, once a
	// later epoch is seen.
	cur    atomic.Uint64
	fenced atomic.Bool
	// mu serialises raises of the file by this process.
	mu sync.Mutex
	// lock orders checked writes against raises; nil without a file.
	lock *epochLock
	// seen is the file's epoch as last read, under the file's stamp: the
	// checks of replies stat the file and read it only when it changed.
	seen atomic.Pointer[seenEpoch]
	// afterCheck, set by tests, runs inside guard between the check and
	// the write.
	afterCheck func()
}

// fileStamp identifies one version of the epoch file (stampOf).
type fileStamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

type seenEpoch struct {
	stamp fileStamp
	epoch uint64
}

func newEpochState(path string) (*epochState, error) {
	e := &epochState{path: path, lock: newEpochLock(path)}
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
	n, _, _, err := readEpochStamped(path)
	return n, err
}

// readEpochStamped reads the epoch file and the stamp of the version it
// read (ok false when the platform gives none, or there is no file).
func readEpochStamped(path string) (n uint64, st fileStamp, ok bool, err error) {
	if path == "" {
		return 0, fileStamp{}, false, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fileStamp{}, false, nil
	}
	if err != nil {
		return 0, fileStamp{}, false, fmt.Errorf("checkpoint epoch file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fileStamp{}, false, fmt.Errorf("checkpoint epoch file: %w", err)
	}
	st, ok = stampOf(fi)
	b, err := io.ReadAll(io.LimitReader(f, 64))
	if err != nil {
		return 0, fileStamp{}, false, fmt.Errorf("checkpoint epoch file: %w", err)
	}
	text := strings.TrimSpace(string(b))
	if text == "" {
		return 0, st, ok, nil
	}
	n, err = strconv.ParseUint(text, 10, 64)
	if err != nil {
		return 0, fileStamp{}, false, fmt.Errorf("checkpoint epoch file %s: %w", path, err)
	}
	return n, st, ok, nil
}

// readCached is readEpochFile for the checks of replies: one stat when
// the file is the version last read. A raise replaces the file (a new
// inode), so the next stat after it misses the cache. On NFS a stat may
// be answered from the client's attribute cache, so a reply check can
// lag a raise by the mount's attribute timeout; guard never uses the
// cache, and peers refuse the reply by its header meanwhile.
func (e *epochState) readCached() (uint64, error) {
	if e.path == "" {
		return 0, nil
	}
	st, ok, err := statStamp(e.path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("checkpoint epoch file: %w", err)
	}
	if ok {
		if s := e.seen.Load(); s != nil && s.stamp == st {
			return s.epoch, nil
		}
	}
	// Opened after the stat: what is read is that version or a later one,
	// and a later one's stamp differs from the one it is filed under, so
	// the next check reads again rather than trusting a stale epoch.
	n, st, ok, err := readEpochStamped(e.path)
	if err != nil {
		return 0, err
	}
	if ok {
		e.seen.Store(&seenEpoch{stamp: st, epoch: n})
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

// check fences this process if the epoch file names a later epoch. A
// strict check (a durable write's) reads the file afresh and fails on an
// unreadable one; the others (replies, calls) go through the stat cache,
// and a reply is not held hostage to a storage hiccup.
func (e *epochState) check(strict bool) error {
	if e.fenced.Load() {
		return e.staleErr(0)
	}
	var n uint64
	var err error
	if strict {
		n, err = readEpochFile(e.path)
	} else {
		n, err = e.readCached()
	}
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

// guard runs write, a durable write, if the epoch file still names this
// process's epoch, holding off every raise of the epoch until write
// returns (see epochState).
func (e *epochState) guard(write func() error) error {
	if e.lock == nil {
		if err := e.check(true); err != nil {
			return err
		}
		return write()
	}
	if err := e.lock.rlock(); err != nil {
		return apierror.Wrap(apierror.Unavailable, err)
	}
	defer e.lock.runlock()
	if err := e.check(true); err != nil {
		return err
	}
	if e.afterCheck != nil {
		e.afterCheck()
	}
	return write()
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
	if e.lock != nil {
		// Exclusive: every checked write in flight lands first, and every
		// later one sees the new epoch.
		if err := e.lock.lock(); err != nil {
			return apierror.Wrap(apierror.Unavailable, err)
		}
		defer e.lock.unlock()
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
// a restore has moved the fleet past this process. It is an early answer
// only: a durable write goes through UnderEpoch, whose check cannot be
// overtaken by a raise.
func (c *Controller) CheckEpoch() error {
	err := c.epoch.check(true)
	if err != nil && apierror.HasCode(err, apierror.StaleEpoch) {
		c.metrics.refusal(apierror.StaleEpoch)
	}
	return err
}

// UnderEpoch runs write, a durable write of this process (a manifest's
// publication, a capture ledger append), only if the fleet's epoch is
// still this process's, and keeps a restore from raising the epoch until
// write returns; otherwise it refuses with stale_epoch and write never
// runs. write must not call UnderEpoch.
func (c *Controller) UnderEpoch(write func() error) error {
	wrote := false
	err := c.epoch.guard(func() error {
		wrote = true
		return write()
	})
	if err != nil && !wrote && apierror.HasCode(err, apierror.StaleEpoch) {
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
// so a caller never accepts a result a zombie produced. A reply that is
// streamed (flushed while the handler runs: the model server's SSE) is
// checked again before each later write, each an event, through the stat
// cache: a stream under way when the process was paused ends in an error
// once the epoch moved past it (abortStream), never in a completed reply.
type epochWriter struct {
	http.ResponseWriter
	c       *Controller
	r       *http.Request
	write   ErrorWriter
	decided bool
	refused bool
	// streaming is set by the first flush after the headers went out.
	streaming bool
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
		w.write(w.ResponseWriter, w.r, err)
		return false
	}
	w.ResponseWriter.Header().Set(EpochHeader, strconv.FormatUint(w.c.epoch.cur.Load(), 10))
	return true
}

// recheck checks the epoch again mid-stream and ends the stream if it
// moved past this process's.
func (w *epochWriter) recheck() bool {
	if w.refused {
		return false
	}
	if !w.streaming {
		return true
	}
	err := w.c.epoch.check(false)
	if err == nil {
		return true
	}
	w.refused = true
	w.c.metrics.refusal(apierror.StaleEpoch)
	w.abortStream(err)
	return false
}

// abortStream ends a stream whose status and headers are gone. An SSE
// stream gets one event both stream protocols read as a failure: named
// "error", with the Responses error event's fields (type, code, message;
// openai.EventResponseErrorGeneric) beside the error object a Chat
// Completions stream fails with (openai.ChatChunk.Error); no "[DONE]" and
// no byte of the handler's passes after it. Any other streamed body can
// only be cut short.
func (w *epochWriter) abortStream(err error) {
	if !strings.HasPrefix(w.ResponseWriter.Header().Get("Content-Type"), "text/event-stream") {
		return
	}
	e := apierror.From(err)
	env := apierror.OpenAIEnvelopeOf(e)
	b, merr := codec.MarshalStable(streamAbort{Type: "error", Code: string(e.Code), Message: e.Detail, Error: env.Error})
	if merr != nil {
		return
	}
	var buf bytes.Buffer
	buf.WriteString("event: error\ndata: ")
	buf.Write(b)
	buf.WriteString("\n\n")
	if _, werr := w.ResponseWriter.Write(buf.Bytes()); werr != nil {
		return
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// streamAbort is the data of abortStream's event.
type streamAbort struct {
	Type    string              `json:"type"`
	Code    string              `json:"code"`
	Message string              `json:"message"`
	Error   apierror.OpenAIBody `json:"error"`
}

func (w *epochWriter) WriteHeader(status int) {
	if w.decide() {
		w.ResponseWriter.WriteHeader(status)
	}
}

func (w *epochWriter) Write(b []byte) (int, error) {
	if !w.decide() || !w.recheck() {
		return 0, errFencedReply
	}
	return w.ResponseWriter.Write(b)
}

func (w *epochWriter) Flush() {
	if w.decided && w.refused {
		return
	}
	if w.decided {
		w.streaming = true
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
	resp, err := t.base.RoundTrip(withEpoch(req, own))
	if err != nil {
		return resp, err
	}
	if len(resp.Header[EpochHeader]) == 0 {
		return resp, nil
	}
	return t.checkReply(req, resp, own)
}

// StartRoundTrip is RoundTrip for a caller that does not wait for the
// reply (httpclient.Starter): the epoch goes on req itself, which a
// Starter's caller builds for the one call, rather than on a copy a
// parked call would keep besides; the reply's epoch is checked on the
// goroutine it arrives on.
func (t *epochTransport) StartRoundTrip(req *http.Request, maxBody int64, done func(*http.Response, error)) {
	if t.c.epoch.fenced.Load() {
		closeReqBody(req)
		done(refusal(nil, t.c.epoch.staleErr(0)), nil)
		return
	}
	own := t.c.epoch.cur.Load()
	req.Header.Set(EpochHeader, strconv.FormatUint(own, 10))
	httpclient.StartRoundTrip(t.base, req, maxBody, func(resp *http.Response, err error) {
		if err != nil || len(resp.Header[EpochHeader]) == 0 {
			done(resp, err)
			return
		}
		done(t.checkReply(nil, resp, own))
	})
}

// withEpoch is a copy of req carrying the fleet's epoch. Apart from
// RoundTrip, whose frame stays on the stack of every caller waiting for a
// reply.
func withEpoch(req *http.Request, own uint64) *http.Request {
	r2 := req.Clone(req.Context())
	r2.Header.Set(EpochHeader, strconv.FormatUint(own, 10))
	return r2
}

// checkReply refuses a reply of another epoch than own.
func (t *epochTransport) checkReply(req *http.Request, resp *http.Response, own uint64) (*http.Response, error) {
	v := resp.Header.Get(EpochHeader)
	if v == "" {
		return resp, nil
	}
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
