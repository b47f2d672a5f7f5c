package gymstandin

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf16"
)

// Participant stands in for a NeMo Gym server that takes part in
// checkpoints, where Gym's own cannot run here (no nemo-gym release carries
// nemo_gym._checkpoint): NeMo Gym's control plane (nemo_gym/_checkpoint/
// control.py @ 011c3386d691: ParticipantControlPlane, its FastAPI routes
// and request models, errors.py @ 7f40a593c741) in front of a stateless
// resources participant (resources.py @ 011c3386d691: sessions bound to
// episodes, recorded with null state), writing and reading its directory
// as store.py @ 05bf55ac50b5 does: records as Python's json.dumps writes
// them, the manifest as json.dumps(sort_keys=True, indent=1). Served as
// uvicorn serves it (HTTP/1.1 only, FastAPI's 404). TestParticipant
// replays the replies Gym's own control plane gave for the same calls
// (testdata/control-py-011c3386.json) against it.
type Participant struct {
	*Uvicorn
	token, instance string

	mu            sync.Mutex
	phase         string
	checkpointID  *string
	lease         *float64
	resumed       []string // recently resumed ids, oldest first
	results       map[[2]string]any
	marks         map[string]int // retired: rollout id -> highest attempt
	sessions      map[string]episodeID
	order         []string // session ids in the order they were bound
	restoredPend  map[string]bool
	write         *gymWrite
	requests      []Request
	leaseGraceSec float64
}

// Request is one control call the participant received, its body as sent.
type Request struct {
	Op   string
	Body map[string]any
}

type episodeID struct {
	RolloutID string
	Attempt   int
}

func (e episodeID) key() string {
	if e.Attempt == 0 {
		return e.RolloutID
	}
	return fmt.Sprintf("%s-a%d", e.RolloutID, e.Attempt)
}

// gymWrite is control.py's _Write: one export per checkpoint id.
type gymWrite struct {
	id, dir string
	scope   *[]episodeID
	records []string // record lines, each ending in a newline
	keys    []string
}

// Kind is the participant's kind.
const participantKind = "resources"

// StartParticipant serves a stand-in Gym resources participant named
// instance, taking token as its bearer token.
func StartParticipant(t testing.TB, instance, token string) *Participant {
	t.Helper()
	p := &Participant{
		token: token, instance: instance, phase: "idle", results: map[[2]string]any{},
		marks: map[string]int{}, sessions: map[string]episodeID{}, restoredPend: map[string]bool{},
		leaseGraceSec: 600,
	}
	p.Uvicorn = StartUvicorn(t, http.HandlerFunc(p.serve))
	return p
}

// Requests lists the control calls received, oldest first.
func (p *Participant) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.requests)
}

// Seed binds a session to an episode, as a successful /seed_session under
// the episode's /ng-rollout prefix does on Gym's resources servers.
func (p *Participant) Seed(sessionID, rolloutID string, attempt int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seedLocked(sessionID, rolloutID, attempt)
}

func (p *Participant) seedLocked(sessionID, rolloutID string, attempt int) {
	if _, ok := p.sessions[sessionID]; !ok {
		p.order = append(p.order, sessionID)
	}
	p.sessions[sessionID] = episodeID{rolloutID, attempt}
}

// Sessions returns the sessions held, by session id.
func (p *Participant) Sessions() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]string{}
	for s, e := range p.sessions {
		out[s] = e.key()
	}
	return out
}

// controlError is errors.py's ControlError: its status and code.
type controlError struct {
	status       int
	code, detail string
}

func (e *controlError) Error() string { return e.code + ": " + e.detail }

func cerr(status int, code, format string, args ...any) *controlError {
	return &controlError{status, code, fmt.Sprintf(format, args...)}
}

// validationError is FastAPI's RequestValidationError: 422 {"detail": [...]}.
type validationError []map[string]any

func (v validationError) Error() string { return fmt.Sprint([]map[string]any(v)) }

const routePrefix = "/ng-control/v1/checkpoint/"

func (p *Participant) serve(w http.ResponseWriter, r *http.Request) {
	op, ok := strings.CutPrefix(r.URL.Path, routePrefix)
	if m := seedPath.FindStringSubmatch(r.URL.Path); m != nil && r.Method == http.MethodPost {
		p.seed(w, r, m[1])
		return
	}
	method := http.MethodPost
	if op == "status" {
		method = http.MethodGet
	}
	if !ok || !slices.Contains([]string{"status", "prepare", "renew", "commit", "restore", "resume", "retire", "forget"}, op) {
		writeJSON(w, http.StatusNotFound, map[string]any{"detail": "Not Found"})
		return
	}
	if r.Method != method {
		writeJSON(w, http.StatusMethodNotAllowed, map[string]any{"detail": "Method Not Allowed"})
		return
	}
	var body map[string]any
	if op != "status" {
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &body); err != nil || body == nil {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": []any{map[string]any{
				"type": "json_invalid", "loc": []any{"body", 0}, "msg": "JSON decode error", "input": map[string]any{}}}})
			return
		}
		// FastAPI validates the body before the handler checks the token.
		if verr := validate(op, body); verr != nil {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": verr})
			return
		}
	}
	if r.Header.Get("Authorization") != "Bearer "+p.token {
		writeJSON(w, http.StatusUnauthorized, envelope(cerr(401, "unauthorized", "missing or invalid checkpoint control bearer token")))
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if op != "status" {
		p.requests = append(p.requests, Request{Op: op, Body: body})
	}
	reply, err := p.dispatch(op, body)
	var ce *controlError
	switch {
	case errors.As(err, &ce):
		writeJSON(w, ce.status, envelope(ce))
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, map[string]any{"detail": err.Error()})
	default:
		writeJSON(w, http.StatusOK, reply)
	}
}

var seedPath = regexp.MustCompile(`^/ng-rollout/([^/]+)/seed_session$`)

func (p *Participant) seed(w http.ResponseWriter, r *http.Request, key string) {
	var body struct {
		SessionID string `json:"session_id"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.SessionID == "" {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": "session_id required"})
		return
	}
	id, attempt := key, 0
	if m := attemptSuffix.FindStringSubmatchIndex(key); m != nil {
		attempt, _ = strconv.Atoi(key[m[2]:m[3]])
		id = key[:m[0]]
	}
	p.Seed(body.SessionID, id, attempt)
	writeJSON(w, http.StatusOK, map[string]any{})
}

func envelope(e *controlError) map[string]any {
	return map[string]any{"error": map[string]any{"code": e.code, "detail": e.detail}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// The request models of control.py: CheckpointRequest (checkpoint_id,
// deadline_ts), CommitRequest (+ checkpoint_dir, episode_ids optional,
// stop), RestoreRequest (+ checkpoint_dir, episode_ids), RetireRequest
// (+ episode_ids, at least one), ForgetRequest (+ rollout_ids, at least
// one); extra fields forbidden everywhere, EpisodeId's too.
var (
	idPattern     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	attemptSuffix = regexp.MustCompile(`-a([1-9][0-9]*)$`)
)

func validate(op string, body map[string]any) validationError {
	fields := map[string]bool{"checkpoint_id": true, "deadline_ts": true}
	switch op {
	case "commit":
		fields["checkpoint_dir"], fields["episode_ids"], fields["stop"] = true, false, false
	case "restore":
		fields["checkpoint_dir"], fields["episode_ids"] = true, true
	case "retire":
		fields["episode_ids"] = true
	case "forget":
		fields["rollout_ids"] = true
	}
	var errs validationError
	add := func(typ string, loc []any, msg string, input any) {
		errs = append(errs, map[string]any{"type": typ, "loc": append([]any{"body"}, loc...), "msg": msg, "input": input})
	}
	for _, f := range []string{"checkpoint_id", "deadline_ts", "checkpoint_dir", "episode_ids", "rollout_ids", "stop"} {
		required, known := fields[f]
		v, present := body[f]
		if !known {
			continue
		}
		if !present {
			if required {
				add("missing", []any{f}, "Field required", body)
			}
			continue
		}
		switch f {
		case "checkpoint_id":
			s, ok := v.(string)
			switch {
			case !ok:
				add("string_type", []any{f}, "Input should be a valid string", v)
			case len(s) == 0:
				add("string_too_short", []any{f}, "String should have at least 1 character", v)
			case len(s) > 128:
				add("string_too_long", []any{f}, "String should have at most 128 characters", v)
			case !idPattern.MatchString(s):
				add("string_pattern_mismatch", []any{f}, "String should match pattern '^[A-Za-z0-9][A-Za-z0-9._-]*$'", v)
			}
		case "deadline_ts":
			if n, ok := v.(float64); !ok || math.IsInf(n, 0) || math.IsNaN(n) {
				add("float_type", []any{f}, "Input should be a valid number", v)
			}
		case "checkpoint_dir":
			if s, ok := v.(string); !ok || s == "" {
				add("string_too_short", []any{f}, "String should have at least 1 character", v)
			}
		case "stop":
			if _, ok := v.(bool); !ok {
				add("bool_type", []any{f}, "Input should be a valid boolean", v)
			}
		case "episode_ids":
			if v == nil && op == "commit" {
				continue
			}
			list, ok := v.([]any)
			if !ok {
				add("list_type", []any{f}, "Input should be a valid list", v)
				continue
			}
			if op == "retire" && len(list) == 0 {
				add("too_short", []any{f}, "List should have at least 1 item after validation, not 0", v)
			}
			for i, e := range list {
				if _, err := parseEpisode(e); err != nil {
					add(err.Error(), []any{f, i}, "Input should be a valid EpisodeId", e)
				}
			}
		case "rollout_ids":
			list, ok := v.([]any)
			if !ok {
				add("list_type", []any{f}, "Input should be a valid list", v)
				continue
			}
			if len(list) == 0 {
				add("too_short", []any{f}, "List should have at least 1 item after validation, not 0", v)
			}
			for i, e := range list {
				if _, ok := e.(string); !ok {
					add("string_type", []any{f, i}, "Input should be a valid string", e)
				}
			}
		}
	}
	for f, v := range body {
		if _, known := fields[f]; !known {
			add("extra_forbidden", []any{f}, "Extra inputs are not permitted", v)
		}
	}
	return errs
}

// parseEpisode is EpisodeId.model_validate (episode_types.py @ 05bf55ac50b5).
func parseEpisode(v any) (episodeID, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return episodeID{}, errors.New("model_type")
	}
	for k := range m {
		if k != "rollout_id" && k != "attempt" {
			return episodeID{}, errors.New("extra_forbidden")
		}
	}
	id, ok := m["rollout_id"].(string)
	if !ok || !idPattern.MatchString(id) || attemptSuffix.MatchString(id) {
		return episodeID{}, errors.New("value_error")
	}
	e := episodeID{RolloutID: id}
	if a, present := m["attempt"]; present {
		f, ok := a.(float64)
		if !ok || f < 0 || f != math.Trunc(f) {
			return episodeID{}, errors.New("int_type")
		}
		e.Attempt = int(f)
	}
	return e, nil
}

func episodes(v any) []episodeID {
	list, _ := v.([]any)
	out := make([]episodeID, 0, len(list))
	for _, e := range list {
		id, _ := parseEpisode(e)
		out = append(out, id)
	}
	return out
}

func (p *Participant) dispatch(op string, body map[string]any) (any, error) {
	switch op {
	case "status":
		return p.status(), nil
	}
	id := body["checkpoint_id"].(string)
	deadline := body["deadline_ts"].(float64)
	switch op {
	case "renew":
		if err := p.admit(id, "preparing", "prepared", "committed", "restored"); err != nil {
			return nil, err
		}
		p.renew(deadline)
		return map[string]any{"lease_expires_at": *p.lease}, nil
	case "prepare":
		if r, ok := p.results[[2]string{id, "prepare"}]; ok {
			return r, nil
		}
		if err := p.admit(id, "idle", "preparing"); err != nil {
			return nil, err
		}
		p.checkpointID, p.phase = &id, "prepared" // this participant is always ready
		p.renew(deadline)
		r := map[string]any{"phase": "prepared", "report": p.report()}
		p.results[[2]string{id, "prepare"}] = r
		return r, nil
	case "commit":
		return p.commit(id, deadline, body)
	case "restore":
		return p.restore(id, deadline, body)
	case "resume":
		if slices.Contains(p.resumed, id) {
			return map[string]any{"phase": "idle", "idempotent": true}, nil
		}
		if p.phase == "idle" && p.checkpointID == nil {
			p.remember(id)
			return map[string]any{"phase": "idle", "idempotent": true}, nil
		}
		if err := p.admit(id, "preparing", "prepared", "committed", "restored"); err != nil {
			return nil, err
		}
		p.reopen(id)
		return map[string]any{"phase": "idle", "idempotent": false}, nil
	case "retire":
		if err := p.admitOutside(id, deadline); err != nil {
			return nil, err
		}
		if err := within(id, deadline); err != nil {
			return nil, err
		}
		ids := episodes(body["episode_ids"])
		retired := make([]string, 0, len(ids))
		for _, e := range ids {
			if cur, ok := p.marks[e.RolloutID]; !ok || e.Attempt > cur {
				p.marks[e.RolloutID] = e.Attempt
			}
			for s, bound := range p.sessions {
				if bound.RolloutID == e.RolloutID && bound.Attempt <= e.Attempt {
					p.dropSession(s)
				}
			}
			retired = append(retired, e.key())
		}
		return map[string]any{"retired": retired}, nil
	case "forget":
		if err := p.admitOutside(id, deadline); err != nil {
			return nil, err
		}
		if err := within(id, deadline); err != nil {
			return nil, err
		}
		var ids []string
		for _, r := range body["rollout_ids"].([]any) {
			ids = append(ids, r.(string))
			delete(p.marks, r.(string))
		}
		sort.Strings(ids)
		return map[string]any{"forgotten": ids}, nil
	}
	return nil, fmt.Errorf("unknown operation %s", op)
}

func (p *Participant) status() map[string]any {
	st := map[string]any{
		"kind": participantKind, "instance": p.instance, "phase": p.phase,
		"checkpoint_id": nil, "lease_expires_at": nil, "retired_rollouts": len(p.marks), "report": p.report(),
		"mode": "stateless", "verify": "replay", "retired_sessions": 0,
	}
	if p.checkpointID != nil {
		st["checkpoint_id"] = *p.checkpointID
	}
	if p.lease != nil {
		st["lease_expires_at"] = *p.lease
	}
	return st
}

func (p *Participant) report() map[string]any {
	return map[string]any{"ready": true, "blockers": []string{}, "blocker_count": 0,
		"counts": map[string]int{"inflight": 0, "sessions": len(p.sessions)}, "restarts": []string{}}
}

// admit is control.py's _admit.
func (p *Participant) admit(id string, allowed ...string) error {
	if slices.Contains(p.resumed, id) {
		return cerr(409, "stale_checkpoint", "checkpoint %s was already resumed", pyRepr(id))
	}
	if p.checkpointID != nil && *p.checkpointID != id {
		return cerr(409, "checkpoint_conflict", "checkpoint %s is active in phase %s", pyRepr(*p.checkpointID), p.phase)
	}
	if !slices.Contains(allowed, p.phase) {
		return cerr(409, "invalid_phase", "not valid in phase %s", p.phase)
	}
	return nil
}

// admitOutside is control.py's _admit_outside_checkpoint.
func (p *Participant) admitOutside(id string, deadline float64) error {
	if p.phase != "idle" && p.phase != "restored" {
		return cerr(409, "invalid_phase", "not valid in phase %s; resume first", p.phase)
	}
	if p.checkpointID != nil && *p.checkpointID != id {
		return cerr(409, "checkpoint_conflict", "checkpoint %s is active", pyRepr(*p.checkpointID))
	}
	if p.phase != "idle" {
		p.renew(deadline)
	}
	return nil
}

// within is the deadline check of control.py's _within.
func within(id string, deadline float64) error {
	if deadline-float64(time.Now().UnixNano())/1e9 <= 0 {
		return cerr(409, "deadline_exceeded", "checkpoint %s deadline passed", pyRepr(id))
	}
	return nil
}

func (p *Participant) renew(deadline float64) {
	l := deadline + p.leaseGraceSec
	if p.lease == nil || l > *p.lease {
		p.lease = &l
	}
}

func (p *Participant) remember(id string) {
	p.resumed = append(p.resumed, id)
	if len(p.resumed) > 64 {
		p.resumed = p.resumed[1:]
	}
}

func (p *Participant) reopen(resumeID string) {
	p.write = nil
	p.remember(resumeID)
	for k := range p.results {
		if k[0] == resumeID {
			delete(p.results, k)
		}
	}
	p.phase, p.checkpointID, p.lease = "idle", nil, nil
}

func (p *Participant) dropSession(s string) {
	delete(p.sessions, s)
	delete(p.restoredPend, s)
	p.order = slices.DeleteFunc(p.order, func(x string) bool { return x == s })
}

func (p *Participant) commit(id string, deadline float64, body map[string]any) (any, error) {
	if r, ok := p.results[[2]string{id, "commit"}]; ok {
		return r, nil
	}
	if err := p.admit(id, "prepared"); err != nil {
		return nil, err
	}
	p.renew(deadline)
	dir := body["checkpoint_dir"].(string)
	var scope *[]episodeID
	if body["episode_ids"] != nil {
		s := episodes(body["episode_ids"])
		scope = &s
	}
	if p.write == nil || p.write.id != id {
		if err := within(id, deadline); err != nil {
			return nil, err
		}
		w := &gymWrite{id: id, dir: dir, scope: scope}
		keys := map[string]bool{}
		for _, s := range p.order {
			e := p.sessions[s]
			// resources.py export: live sessions, and restored ones the scope names.
			if scope != nil && p.restoredPend[s] && !slices.Contains(*scope, e) {
				continue
			}
			w.records = append(w.records, fmt.Sprintf(`{"episode_id": {"rollout_id": %s, "attempt": %d}, "session_id": %s, "owner": null, "state": null}`+"\n",
				pyString(e.RolloutID), e.Attempt, pyString(s)))
			keys[e.key()] = true
		}
		for k := range keys {
			w.keys = append(w.keys, k)
		}
		sort.Strings(w.keys)
		p.write = w
	} else if p.write.dir != dir || !sameScope(p.write.scope, scope) {
		return nil, cerr(409, "checkpoint_conflict", "checkpoint %s is already being written to another directory or scope", pyRepr(id))
	}
	if err := within(id, deadline); err != nil {
		return nil, err
	}
	manifest, err := writeState(dir, p.instance, id, p.write.records)
	if err != nil {
		return nil, err
	}
	if scope != nil {
		for s := range p.restoredPend {
			if !slices.Contains(*scope, p.sessions[s]) {
				p.dropSession(s)
			}
		}
	}
	p.phase = "committed"
	r := map[string]any{"phase": "committed", "manifest": manifest, "episode_ids": p.write.keys}
	p.results[[2]string{id, "commit"}] = r
	return r, nil
}

func sameScope(a, b *[]episodeID) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(*a, *b)
}

// writeState is store.py's write_participant_state: the records file
// named after its digest, then the manifest, created once.
func writeState(dir, instance, id string, records []string) (map[string]any, error) {
	pdir := filepath.Join(dir, "gym", participantKind, instance)
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		return nil, cerr(422, "invalid_checkpoint_state", "cannot write checkpoint state under %s: %v", dir, err)
	}
	data := strings.Join(records, "")
	sum := sha256.Sum256([]byte(data))
	digest := hex.EncodeToString(sum[:])
	file := "records-" + digest + ".jsonl"
	if err := os.WriteFile(filepath.Join(pdir, file), []byte(data), 0o644); err != nil {
		return nil, cerr(422, "invalid_checkpoint_state", "cannot write checkpoint state under %s: %v", dir, err)
	}
	manifest := map[string]any{
		"schema_version": 1, "kind": participantKind, "instance": instance, "checkpoint_id": id,
		"records_file": file, "records_sha256": digest, "record_count": len(records),
	}
	text := fmt.Sprintf("{\n \"checkpoint_id\": %s,\n \"instance\": %s,\n \"kind\": %s,\n \"record_count\": %d,\n \"records_file\": %s,\n \"records_sha256\": %s,\n \"schema_version\": 1\n}",
		pyString(id), pyString(instance), pyString(participantKind), len(records), pyString(file), pyString(digest))
	path := filepath.Join(pdir, "manifest.json")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, os.ErrExist) {
		existing, rerr := os.ReadFile(path)
		if rerr != nil || string(existing) != text {
			return nil, cerr(422, "invalid_checkpoint_state", "%s already holds a different commit", path)
		}
		return manifest, nil
	}
	if err != nil {
		return nil, cerr(422, "invalid_checkpoint_state", "cannot write checkpoint state under %s: %v", dir, err)
	}
	_, err = f.WriteString(text)
	if cerr2 := f.Close(); err == nil {
		err = cerr2
	}
	if err != nil {
		return nil, cerr(422, "invalid_checkpoint_state", "cannot write checkpoint state under %s: %v", dir, err)
	}
	return manifest, nil
}

func (p *Participant) restore(id string, deadline float64, body map[string]any) (any, error) {
	if r, ok := p.results[[2]string{id, "restore"}]; ok {
		return r, nil
	}
	if err := p.admit(id, "idle"); err != nil {
		return nil, err
	}
	if err := within(id, deadline); err != nil {
		return nil, err
	}
	scope := episodes(body["episode_ids"])
	manifest, records, err := ReadState(body["checkpoint_dir"].(string), participantKind, p.instance)
	if err != nil {
		return nil, cerr(422, "invalid_checkpoint_state", "%v", err)
	}
	type rec struct {
		EpisodeID map[string]any `json:"episode_id"`
		SessionID string         `json:"session_id"`
	}
	var install []struct {
		session string
		id      episodeID
	}
	for _, line := range records {
		var r rec
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, cerr(422, "invalid_checkpoint_state", "checkpoint record is invalid: %v", err)
		}
		e, err := parseEpisode(map[string]any(r.EpisodeID))
		if err != nil {
			return nil, cerr(422, "invalid_checkpoint_state", "checkpoint record has no valid episode_id: %v", err)
		}
		if slices.Contains(scope, e) {
			install = append(install, struct {
				session string
				id      episodeID
			}{r.SessionID, e})
		}
	}
	if len(p.sessions) > 0 {
		return nil, cerr(409, "checkpoint_error", "resources restore requires a process that has not served sessions")
	}
	restored := []string{}
	for _, in := range install {
		next := episodeID{in.id.RolloutID, in.id.Attempt + 1}
		p.seedLocked(in.session, next.RolloutID, next.Attempt)
		p.restoredPend[in.session] = true
		restored = append(restored, next.key())
	}
	sort.Strings(restored)
	p.checkpointID, p.phase = &id, "restored"
	p.renew(deadline)
	r := map[string]any{"phase": "restored", "source_checkpoint_id": manifest["checkpoint_id"], "restored": restored}
	p.results[[2]string{id, "restore"}] = r
	return r, nil
}

// ReadState reads <dir>/gym/<kind>/<instance> as store.py's
// read_participant_state does, returning the manifest and the record lines.
func ReadState(dir, kind, instance string) (map[string]any, []string, error) {
	pdir := filepath.Join(dir, "gym", kind, instance)
	b, err := os.ReadFile(filepath.Join(pdir, "manifest.json"))
	if err != nil {
		return nil, nil, fmt.Errorf("missing manifest %s", filepath.Join(pdir, "manifest.json"))
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return nil, nil, fmt.Errorf("%s is not a manifest", filepath.Join(pdir, "manifest.json"))
	}
	if m["schema_version"] != float64(1) || m["kind"] != kind || m["instance"] != instance {
		return nil, nil, fmt.Errorf("manifest of %v/%v, schema %v", m["kind"], m["instance"], m["schema_version"])
	}
	if _, ok := m["checkpoint_id"].(string); !ok {
		return nil, nil, errors.New("manifest names no checkpoint")
	}
	file, _ := m["records_file"].(string)
	if !regexp.MustCompile(`^records(-[0-9a-f]{64})?\.jsonl$`).MatchString(file) {
		return nil, nil, fmt.Errorf("invalid records file %q", file)
	}
	data, err := os.ReadFile(filepath.Join(pdir, file))
	if err != nil {
		return nil, nil, err
	}
	sum := sha256.Sum256(data)
	var lines []string
	for rest := string(data); rest != ""; {
		line := rest
		if i := strings.IndexByte(rest, '\n'); i >= 0 {
			line = rest[:i+1]
		}
		rest = rest[len(line):]
		lines = append(lines, line)
	}
	if hex.EncodeToString(sum[:]) != m["records_sha256"] || m["record_count"] != float64(len(lines)) {
		return nil, nil, errors.New("records do not match the manifest")
	}
	return m, lines, nil
}

// pyRepr is an id as Python's repr writes it in errors' details (ids
// match the id pattern: no quote to escape).
func pyRepr(s string) string { return "'" + s + "'" }

// pyString is a string as Python's json.dumps writes it (ensure_ascii).
func pyString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || (r > 0x7f && r <= 0xffff):
			fmt.Fprintf(&b, `\u%04x`, r)
		case r > 0xffff:
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, hi, lo)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
