package apierror_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
)

// declaredCodes reads every constant of type Code from the package source,
// so a code added without a status fails TestEveryCodeHasAStatus instead of
// silently answering 500 (the Prometheus respondError footgun).
func declaredCodes(t *testing.T) map[string]string {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), "apierror.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]string{} // constant name → code text
	aliases := map[string]string{}
	for _, decl := range file.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		for _, spec := range gen.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for i, name := range vs.Names {
				switch v := vs.Values[i].(type) {
				case *ast.BasicLit:
					s, err := strconv.Unquote(v.Value)
					if err != nil {
						t.Fatal(err)
					}
					values[name.Name] = s
				case *ast.Ident:
					aliases[name.Name] = v.Name
				default:
					t.Fatalf("constant %s: unexpected value %T", name.Name, v)
				}
			}
		}
	}
	for name, target := range aliases {
		s, ok := values[target]
		if !ok {
			t.Fatalf("constant %s aliases unknown %s", name, target)
		}
		values[name] = s
	}
	if len(values) < 20 {
		t.Fatalf("found only %d Code constants; the parser missed some", len(values))
	}
	return values
}

func TestEveryCodeHasAStatus(t *testing.T) {
	codes := apierror.Codes()
	listed := map[apierror.Code]bool{}
	for _, c := range codes {
		if listed[c] {
			t.Errorf("Codes() lists %q twice", c)
		}
		listed[c] = true
	}
	for name, text := range declaredCodes(t) {
		if !listed[apierror.Code(text)] {
			t.Errorf("constant %s (%q) is not in Codes(), so it has no status", name, text)
		}
	}
	if !slices.IsSorted(codes) {
		t.Errorf("Codes() is not sorted: %v", codes)
	}
	for _, c := range codes {
		t.Run(string(c), func(t *testing.T) {
			status := apierror.Status(c)
			if status < 400 || status > 599 {
				t.Fatalf("Status(%q) = %d, not an error status", c, status)
			}
			if status == http.StatusInternalServerError && c != apierror.Internal {
				t.Fatalf("Status(%q) = 500, the unknown-code default", c)
			}
			rec := httptest.NewRecorder()
			apierror.Write(rec, httptest.NewRequest(http.MethodGet, "/x", nil), nil, apierror.New(c, "detail of %s", c))
			if rec.Code != status {
				t.Fatalf("Write answered %d, want %d", rec.Code, status)
			}
			want := fmt.Sprintf(`{"error":{"code":%q,"detail":"detail of %s"}}`+"\n", c, c)
			if got := rec.Body.String(); got != want {
				t.Fatalf("body = %q, want %q", got, want)
			}
			if got := rec.Header().Get("Content-Type"); got != "application/json" {
				t.Fatalf("Content-Type = %q", got)
			}
			if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
				t.Fatalf("X-Content-Type-Options = %q", got)
			}
		})
	}
}

// The statuses SPEC §3 fixes for the control plane's codes.
func TestStatus_SpecTable(t *testing.T) {
	want := map[apierror.Code]int{
		apierror.Unauthorized:           401,
		apierror.InvalidRequest:         400,
		apierror.RolloutIDRequired:      400,
		apierror.StaleCheckpoint:        409,
		apierror.CheckpointConflict:     409,
		apierror.InvalidPhase:           409,
		apierror.DeadlineExceeded:       409,
		apierror.StaleAttempt:           409,
		apierror.StaleEpoch:             409,
		apierror.AdmissionClosed:        409,
		apierror.RestartInScope:         409,
		apierror.RetireIncomplete:       409,
		apierror.InvalidCheckpointState: 422,
		apierror.Internal:               500,
		apierror.BodyTooLarge:           413,
		apierror.NotFound:               404,
		apierror.MethodNotAllowed:       405,
		apierror.Unavailable:            503,
		apierror.UpstreamError:          502,
		// Beyond SPEC §3, pinned as well (docs/WIRE.md, "Error codes").
		apierror.StorageFull: 507,
	}
	for c, status := range want {
		if got := apierror.Status(c); got != status {
			t.Errorf("Status(%q) = %d, want %d", c, got, status)
		}
	}
	if got := apierror.Status("no_such_code"); got != 500 {
		t.Errorf("Status of an unknown code = %d, want 500", got)
	}
	if apierror.InvalidCheckpoint != apierror.InvalidCheckpointState {
		t.Errorf("InvalidCheckpoint is %q", apierror.InvalidCheckpoint)
	}
}

func TestCodeOfAndFrom(t *testing.T) {
	deadlineCtx, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	canceledCtx, cancel2 := context.WithCancel(context.Background())
	cancel2()
	tests := []struct {
		name       string
		err        error
		wantCode   apierror.Code
		wantStatus int
		wantDetail string
	}{
		{"own code", apierror.New(apierror.UnknownTool, "no tool %q", "x"), apierror.UnknownTool, 404, `no tool "x"`},
		{"wrapped own code", fmt.Errorf("calling: %w", apierror.New(apierror.Gone, "gone")), apierror.Gone, 410, "gone"},
		{"context deadline", deadlineCtx.Err(), apierror.DeadlineExceeded, 409, "context deadline exceeded"},
		{"wrapped deadline", fmt.Errorf("upstream: %w", context.DeadlineExceeded), apierror.DeadlineExceeded, 409, "upstream: context deadline exceeded"},
		{"context canceled", canceledCtx.Err(), apierror.ClientClosed, 499, "context canceled"},
		{"cancel cause", causeErr(), apierror.ClientClosed, 499, "context canceled"},
		{"plain error", errors.New("boom"), apierror.Internal, 500, "boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := apierror.CodeOf(tt.err); got != tt.wantCode {
				t.Fatalf("CodeOf = %q, want %q", got, tt.wantCode)
			}
			e := apierror.From(tt.err)
			if e.Code != tt.wantCode || e.HTTPStatus() != tt.wantStatus || e.Detail != tt.wantDetail {
				t.Fatalf("From = {%q %d %q}, want {%q %d %q}", e.Code, e.HTTPStatus(), e.Detail, tt.wantCode, tt.wantStatus, tt.wantDetail)
			}
			if !errors.Is(e, tt.err) && !errors.Is(tt.err, e) {
				t.Fatalf("From(%v) lost its cause", tt.err)
			}
		})
	}
}

// causeErr is the error of a context cancelled with a cause, which still
// matches context.Canceled.
func causeErr() error {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("server closed"))
	return ctx.Err()
}

func TestError_Methods(t *testing.T) {
	cause := errors.New("disk full")
	w := apierror.Wrap(apierror.Internal, cause)
	if !errors.Is(w, cause) || w.Detail != "disk full" || w.Error() != "internal: disk full" {
		t.Fatalf("Wrap = %#v (%q)", w, w.Error())
	}
	bare := &apierror.Error{Code: apierror.Internal}
	if got := bare.Error(); got != "internal: " {
		t.Fatalf("Error() of a bare error = %q", got)
	}
	// Is matches by code against a detail-less target.
	e := fmt.Errorf("ctx: %w", apierror.New(apierror.StaleAttempt, "attempt 1 retired"))
	if !errors.Is(e, apierror.New(apierror.StaleAttempt, "")) {
		t.Fatal("errors.Is by code failed")
	}
	if errors.Is(e, apierror.New(apierror.StaleAttempt, "other detail")) {
		t.Fatal("errors.Is matched a target with a detail")
	}
	if errors.Is(e, apierror.New(apierror.InvalidPhase, "")) {
		t.Fatal("errors.Is matched another code")
	}
}

func TestWithStatus(t *testing.T) {
	orig := apierror.New(apierror.InvalidRequest, "unknown field")
	e := orig.WithStatus(http.StatusUnprocessableEntity)
	if e == orig {
		t.Fatal("WithStatus returned the same pointer")
	}
	if orig.HTTPStatus() != 400 || orig.Status != 0 {
		t.Fatalf("WithStatus changed the original: %d", orig.HTTPStatus())
	}
	if e.HTTPStatus() != 422 || e.Code != apierror.InvalidRequest || e.Detail != "unknown field" {
		t.Fatalf("WithStatus = %#v", e)
	}
	rec := httptest.NewRecorder()
	apierror.Write(rec, httptest.NewRequest(http.MethodPost, "/x", nil), nil, fmt.Errorf("decode: %w", e))
	if rec.Code != 422 {
		t.Fatalf("Write answered %d, want 422", rec.Code)
	}
}

func TestWrite_LogsServerErrorsOnly(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	req := httptest.NewRequest(http.MethodPost, "/v1/x", nil)
	apierror.Write(httptest.NewRecorder(), req, log, apierror.New(apierror.NotFound, "nope"))
	if logs.Len() != 0 {
		t.Fatalf("a 404 was logged: %s", logs.String())
	}
	apierror.Write(httptest.NewRecorder(), req, log, errors.New("boom"))
	for _, want := range []string{`"code":"internal"`, `"path":"/v1/x"`, `"err":"boom"`} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("log %s lacks %s", logs.String(), want)
		}
	}
}

func TestParse(t *testing.T) {
	t.Run("round trip", func(t *testing.T) {
		for _, e := range []*apierror.Error{
			apierror.New(apierror.StaleAttempt, "attempt 2 of w is retired"),
			apierror.New(apierror.InvalidRequest, `field "x": "quoted" <html> & unicode é`).WithStatus(422),
			apierror.New(apierror.Internal, ""),
		} {
			rec := httptest.NewRecorder()
			apierror.Write(rec, httptest.NewRequest(http.MethodGet, "/", nil), nil, e)
			got := apierror.Parse(rec.Code, rec.Body.Bytes())
			if got == nil {
				t.Fatalf("Parse(%q) = nil", rec.Body)
			}
			if got.Code != e.Code || got.Detail != e.Detail || got.HTTPStatus() != e.HTTPStatus() {
				t.Fatalf("Parse = %#v, want code %q detail %q status %d", got, e.Code, e.Detail, e.HTTPStatus())
			}
		}
	})
	t.Run("not an envelope", func(t *testing.T) {
		for _, body := range []string{
			``, `not json`, `{}`, `[]`, `{"error":"text"}`, `{"error":{"detail":"no code"}}`, `{"error":{"code":7}}`,
			// vLLM's error shape.
			`{"object":"error","message":"This model's maximum context length is 8 tokens","type":"BadRequestError","param":null,"code":400}`,
		} {
			if got := apierror.Parse(400, []byte(body)); got != nil {
				t.Errorf("Parse(%q) = %#v, want nil", body, got)
			}
		}
	})
	t.Run("status kept", func(t *testing.T) {
		got := apierror.Parse(http.StatusServiceUnavailable, []byte(`{"error":{"code":"internal","detail":"x"}}`))
		if got == nil || got.HTTPStatus() != 503 {
			t.Fatalf("Parse = %#v, want status 503", got)
		}
	})
}

func TestHasCode(t *testing.T) {
	err := fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", apierror.New(apierror.AdmissionClosed, "closed")))
	if !apierror.HasCode(err, apierror.AdmissionClosed) {
		t.Fatal("HasCode missed a wrapped code")
	}
	if apierror.HasCode(err, apierror.InvalidPhase) {
		t.Fatal("HasCode matched another code")
	}
	if apierror.HasCode(errors.New("plain"), apierror.Internal) {
		t.Fatal("HasCode matched a plain error")
	}
	if apierror.HasCode(nil, apierror.Internal) {
		t.Fatal("HasCode matched nil")
	}
}

// FuzzParse: Parse never panics on a reply body, and what it accepts writes
// back as an envelope that parses to the same error.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"error":{"code":"stale_attempt","detail":"attempt 1 of w is retired"}}`,
		`{"error":{"code":"internal","detail":""}}`, `{"error":{"code":"x"}}`, `{"error":{"code":""}}`,
		`{"error":null}`, `{"error":{"code":1}}`, `{"object":"error","message":"m","code":400}`, `null`, ``, `[`,
		`{"error":{"code":"invalid_request","detail":"\u003c\u0026\u003e \ud83d\ude00"},"extra":[1]}`,
	} {
		f.Add(400, []byte(s))
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		e := apierror.Parse(status, body)
		if e == nil {
			return
		}
		if e.Code == "" || e.Status != status {
			t.Fatalf("Parse(%d, %q) = %#v", status, body, e)
		}
		if status < 100 || status > 999 {
			return // not writable as a status line
		}
		rec := httptest.NewRecorder()
		apierror.Write(rec, httptest.NewRequest(http.MethodGet, "/", nil), nil, e)
		back := apierror.Parse(rec.Code, rec.Body.Bytes())
		if back == nil || back.Code != e.Code || back.Detail != e.Detail || rec.Code != status {
			t.Fatalf("Parse(%q) = %#v; written %d %q; parsed back %#v", body, e, rec.Code, rec.Body, back)
		}
	})
}

func TestWriteOpenAI(t *testing.T) {
	for _, tt := range []struct {
		err  *apierror.Error
		want string
	}{
		{apierror.New(apierror.InvalidRequest, "bad JSON"),
			`{"error":{"message":"bad JSON","type":"invalid_request_error","param":null,"code":"invalid_request","detail":"bad JSON"}}`},
		{&apierror.Error{Code: apierror.InvalidRequest, Detail: "bad t", Status: 400, Type: "BadRequestError", Param: "temperature"},
			`{"error":{"message":"bad t","type":"BadRequestError","param":"temperature","code":"invalid_request","detail":"bad t"}}`},
		{apierror.New(apierror.UpstreamError, "boom"),
			`{"error":{"message":"boom","type":"server_error","param":null,"code":"upstream_error","detail":"boom"}}`},
	} {
		rec := httptest.NewRecorder()
		apierror.WriteOpenAI(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil), nil, tt.err)
		if got := strings.TrimSpace(rec.Body.String()); got != tt.want || rec.Code != tt.err.HTTPStatus() {
			t.Errorf("%v: %d %s, want %s", tt.err, rec.Code, got, tt.want)
		}
		// Our own clients still read the fleet's envelope from it.
		if e := apierror.Parse(rec.Code, rec.Body.Bytes()); e == nil || e.Code != tt.err.Code || e.Detail != tt.err.Detail {
			t.Errorf("Parse(%s) = %+v", rec.Body.String(), e)
		}
	}
}

// Ensure docs/WIRE.md's table of error codes lists every code
// with its status, and nothing else.
func TestCodes_Documented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "WIRE.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "## Error codes\n")
	if !ok {
		t.Fatal("docs/WIRE.md has no \"## Error codes\" section")
	}
	table, _, _ = strings.Cut(table, "\n#")
	documented := map[string]string{}
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		documented[strings.Trim(strings.TrimSpace(cells[1]), "`")] = strings.TrimSpace(cells[2])
	}
	for _, c := range apierror.Codes() {
		status, ok := documented[string(c)]
		if !ok {
			t.Errorf("code %s is not in the table", c)
			continue
		}
		if want := strconv.Itoa(apierror.Status(c)); status != want {
			t.Errorf("code %s: the table says %s, the code %s", c, status, want)
		}
		delete(documented, string(c))
	}
	for c := range documented {
		t.Errorf("the table lists %s, which is no code", c)
	}
}

// OpenAI's SDKs retry 408, 409, 429 and 5xx unless x-should-retry says
// otherwise (openai 3.63.0, _base_client.py _should_retry): only an error
// marked Retry, or not ready yet, lets them.
func TestWriteOpenAI_ShouldRetry(t *testing.T) {
	for _, c := range []struct {
		err  *apierror.Error
		want string
	}{
		{apierror.New(apierror.StaleAttempt, "retired"), "false"},
		{apierror.New(apierror.UpstreamError, "engine died"), "false"},
		{apierror.New(apierror.InvalidRequest, "bad"), "false"},
		{apierror.New(apierror.Unavailable, "not ready"), "true"},
		{&apierror.Error{Code: apierror.UpstreamError, Detail: "never sent", Retry: true}, "true"},
	} {
		rec := httptest.NewRecorder()
		apierror.WriteOpenAI(rec, httptest.NewRequest(http.MethodPost, "/v1/responses", nil), nil, c.err)
		if got := rec.Header().Get(apierror.ShouldRetryHeader); got != c.want {
			t.Errorf("%v: x-should-retry %q, want %q", c.err, got, c.want)
		}
		if got := c.err.WithStatus(499).Retryable(); got != (c.want == "true") {
			t.Errorf("%v: WithStatus dropped Retry", c.err)
		}
	}
}
