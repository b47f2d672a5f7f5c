package upstream_test

// Checkpoint fixtures: NeMo Gym's checkpoint control wire
// (nemo_gym/_checkpoint/control.py, coordination.py, store.py, errors.py)
// replayed against every participant of an in-process fleet with
// checkpoints on, each reply checked as NeMo RL's adapter
// (gym_checkpoint_adapter.py) and Gym's coordination read it, and each
// directory read back as Gym's store.py reads it.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/tests/fleettest"
)

// pollFor bounds a polled step and an await.
const pollFor = 60 * time.Second

// prepareOrder is coordination.py's PREPARE_ORDER: discovery sorts the
// participants by it, then by server name.
var prepareOrder = []string{"environment", "model", "agent", "resources"}

// ckptRun is a checkpoint fixture's state: the checkpoint root, the
// participants of the fleet and, once a step names it, of the fresh fleet
// a restore goes into.
type ckptRun struct {
	config ctlplane.Config
	fleet  []*member
	fresh  []*member
	start  func() *fleettest.Fleet
}

// member is one participant, as Gym's discover finds it: a server of the
// fleet whose status answers, with the kind and instance it names.
type member struct {
	Name, Kind, Instance, URL string
}

func newCkptRun(t *testing.T) *ckptRun {
	cfg := ctlplanetest.Config()
	cfg.Root = t.TempDir()
	return &ckptRun{config: cfg}
}

// matches reports whether a step's or expectation's On keeps this
// participant (On empty keeps every reply, a non-control one included).
func (m *member) matches(on []string) bool {
	if len(on) == 0 {
		return true
	}
	return m != nil && (slices.Contains(on, m.Name) || slices.Contains(on, m.Kind))
}

func (m *member) suffix() string {
	if m == nil {
		return ""
	}
	return "@" + m.Name
}

// discover finds the fleet's participants as coordination.discover does:
// GET status on every server, 404 meaning none (the fake inference server).
func (c *ckptRun) discover(t *testing.T, client *http.Client, fl *fleettest.Fleet) []*member {
	t.Helper()
	var out []*member
	for _, ep := range fl.Endpoints() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, ep.URL+"/ng-control/v1/checkpoint/status", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+c.config.ControlAuthToken)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("status of %s: %v", ep.Name, err)
		}
		var st struct{ Kind, Instance string }
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			continue
		}
		if err != nil || resp.StatusCode != http.StatusOK || !slices.Contains(prepareOrder, st.Kind) {
			t.Fatalf("status of %s: %d, kind %q (%v)", ep.Name, resp.StatusCode, st.Kind, err)
		}
		out = append(out, &member{Name: ep.Name, Kind: st.Kind, Instance: st.Instance, URL: ep.URL})
	}
	slices.SortFunc(out, func(a, b *member) int {
		if d := slices.Index(prepareOrder, a.Kind) - slices.Index(prepareOrder, b.Kind); d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

func isControlServer(server string) bool {
	for _, p := range []string{"ctl:", "fresh:", "store:"} {
		if strings.HasPrefix(server, p) {
			return true
		}
	}
	return false
}

// controlStep sends a step to one participant or, for "*", to each in
// discovery order (one at a time: a valid order of Gym's stage-wise fan
// out), each reply checked with the expectations that name it. A store
// step reads the participant's directory at Path as Gym's store.py does.
func (r *run) controlStep(t *testing.T, s Step) bool {
	t.Helper()
	if r.ck == nil {
		t.Fatalf("step %s: %s in a fixture without checkpoint", s.Name, s.Server)
	}
	where, name, _ := strings.Cut(s.Server, ":")
	members := r.ck.fleet
	if where == "fresh" {
		r.startFresh(t)
		members = r.ck.fresh
	}
	var selected []*member
	for _, m := range members {
		if (name == "*" || name == m.Name) && m.matches(s.On) {
			selected = append(selected, m)
		}
	}
	if len(selected) == 0 {
		t.Fatalf("step %s: no participant %q (on %v)", s.Name, name, s.On)
	}
	replies := map[string]any{}
	ok := true
	for _, m := range selected {
		ex := &exchange{member: m}
		r.done[s.Name+"@"+m.Name] = ex
		if len(s.Body) > 0 {
			var v any
			if err := json.Unmarshal(s.Body, &v); err != nil {
				t.Fatalf("step %s: body: %v", s.Name, err)
			}
			ex.body = forMember(r.substitute(t, v), m)
		}
		var err error
		if where == "store" {
			dir, _ := r.substitute(t, s.Path).(string)
			err = r.readStore(s, dir, m, ex)
		} else {
			header := http.Header{}
			switch s.Auth {
			case "":
				header.Set("Authorization", "Bearer "+r.ck.config.ControlAuthToken)
			case "wrong":
				header.Set("Authorization", "Bearer not-"+r.ck.config.ControlAuthToken)
			case "none":
			default:
				t.Fatalf("step %s: auth %q", s.Name, s.Auth)
			}
			err = r.send(t.Context(), s, m.URL+s.Path, header, nil, ex)
		}
		if err != nil {
			t.Errorf("step %s@%s: %v", s.Name, m.Name, err)
			ok = false
			continue
		}
		ok = r.checkAll(t, s, ex) && ok
		replies[m.Name] = ex.reply
	}
	r.done[s.Name] = &exchange{reply: replies}
	return ok
}

// startFresh starts the fresh fleet a restore goes into, once: its
// participants, and its servers as fresh_<server> (fresh_env, ...).
func (r *run) startFresh(t *testing.T) {
	t.Helper()
	if r.ck.fresh != nil {
		return
	}
	fl := r.ck.start()
	r.ck.fresh = r.ck.discover(t, r.client, fl)
	for name, u := range fleetURLs(fl) {
		r.urls["fresh_"+name] = u
	}
}

// forMember replaces "$kind" and "$instance" with the participant's.
func forMember(v any, m *member) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = forMember(e, m)
		}
	case []any:
		for i, e := range x {
			x[i] = forMember(e, m)
		}
	case string:
		switch x {
		case "$kind":
			return m.Kind
		case "$instance":
			return m.Instance
		}
	}
	return v
}

// substituteCheckpoint resolves a checkpoint fixture's strings:
// "$deadline:<seconds>" (now plus that many seconds, as Unix seconds) and
// "$ckpt_dir:<name>" (a directory of that name under the checkpoint root).
func (r *run) substituteCheckpoint(t *testing.T, x string) (any, bool) {
	if secs, ok := strings.CutPrefix(x, "$deadline:"); ok {
		d, err := strconv.ParseFloat(secs, 64)
		if err != nil {
			t.Fatalf("%s: %v", x, err)
		}
		return float64(time.Now().UnixNano())/1e9 + d, true
	}
	if name, ok := strings.CutPrefix(x, "$ckpt_dir:"); ok {
		if r.ck == nil {
			t.Fatalf("%s in a fixture without checkpoint", x)
		}
		return filepath.Join(r.ck.config.Root, name), true
	}
	return nil, false
}

// startAsync sends a step in the background; its exchange's done closes
// with the reply.
func (r *run) startAsync(s Step, ex *exchange, send func(context.Context) error) {
	ex.done = make(chan struct{})
	r.async.Add(1)
	go func() {
		defer r.async.Done()
		defer close(ex.done)
		ex.err = send(r.asyncCtx)
	}()
}

// watchAsync makes the test's cleanup end and wait for every async step
// before the fleet closes (cleanups run last registered first).
func (r *run) watchAsync(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r.asyncCtx = ctx
	t.Cleanup(func() {
		cancel()
		r.async.Wait()
	})
}

// await waits for an async step's reply and checks it.
func (r *run) await(t *testing.T, s Step) bool {
	t.Helper()
	ex, ok := r.done[s.Await]
	if !ok || ex.done == nil {
		t.Fatalf("step %s awaits %q, which is no async step that ran", s.Name, s.Await)
	}
	timer := time.NewTimer(pollFor)
	defer timer.Stop()
	select {
	case <-ex.done:
	case <-timer.C:
		t.Errorf("step %s: no reply to %s within %s", s.Name, s.Await, pollFor)
		return false
	}
	r.done[s.Name] = ex
	if ex.err != nil {
		t.Errorf("step %s (%s): %v", s.Name, s.Await, ex.err)
		return false
	}
	return r.checkAll(t, s, ex)
}

// poll sends a step until its status and every expectation hold.
func (r *run) poll(t *testing.T, s Step, ex *exchange, send func(context.Context) error) bool {
	t.Helper()
	deadline := time.Now().Add(pollFor)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := send(t.Context())
		if err == nil && r.holds(s, ex) {
			return r.checkAll(t, s, ex)
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Errorf("step %s: still %v after %s", s.Name, err, pollFor)
				return false
			}
			return r.checkAll(t, s, ex)
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			return false
		}
	}
}

// holds reports whether every expectation of s holds for ex, quietly.
func (r *run) holds(s Step, ex *exchange) bool {
	for _, e := range s.Expect {
		if ex.member.matches(e.On) && r.check(e, ex) != nil {
			return false
		}
	}
	return true
}

// Gym's store.py (nemo_gym/_checkpoint/store.py @ 05bf55ac50b5 and
// e7e449e9aa0d, participant_dir and _read).
var (
	gymNamePattern        = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	gymRecordsFilePattern = regexp.MustCompile(`^records(-[0-9a-f]{64})?\.jsonl$`)
)

// errCheckpointState is Gym's CheckpointStateError.
var errCheckpointState = errors.New("invalid_checkpoint_state")

// readParticipantState reads <dir>/gym/<kind>/<instance> as Gym's
// read_participant_state does: the manifest must exist and be a JSON
// object with schema_version 1, this kind and instance, a string
// checkpoint id and a records file named records[-<sha256>].jsonl; every
// line of that file, newline included, goes into the SHA-256 and the count,
// which must match the manifest's; each line must be JSON.
func readParticipantState(dir, kind, instance string) (map[string]any, []any, error) {
	fail := func(format string, args ...any) (map[string]any, []any, error) {
		return nil, nil, fmt.Errorf("%w: "+format, append([]any{errCheckpointState}, args...)...)
	}
	for _, v := range []string{kind, instance} {
		if !gymNamePattern.MatchString(v) {
			return fail("participant %q is not a safe path component", v)
		}
	}
	pdir := filepath.Join(dir, "gym", kind, instance)
	b, err := os.ReadFile(filepath.Join(pdir, "manifest.json"))
	if err != nil {
		return fail("missing manifest: %v", err)
	}
	var manifest map[string]any
	if err := json.Unmarshal(b, &manifest); err != nil || manifest == nil {
		return fail("manifest is not a JSON object: %v", err)
	}
	if manifest["schema_version"] != float64(1) {
		return fail("unsupported schema %v", manifest["schema_version"])
	}
	if manifest["kind"] != kind || manifest["instance"] != instance {
		return fail("manifest belongs to %v/%v", manifest["kind"], manifest["instance"])
	}
	if _, ok := manifest["checkpoint_id"].(string); !ok {
		return fail("manifest names no checkpoint")
	}
	file, ok := manifest["records_file"].(string)
	if !ok || !gymRecordsFilePattern.MatchString(file) {
		return fail("invalid records file %v", manifest["records_file"])
	}
	data, err := os.ReadFile(filepath.Join(pdir, file))
	if err != nil {
		return fail("cannot read the records: %v", err)
	}
	digest := sha256.New()
	records := []any{}
	for rest := data; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line = rest[:i+1]
		}
		rest = rest[len(line):]
		digest.Write(line)
		var rec any
		if err := json.Unmarshal(line, &rec); err != nil {
			return fail("a record that is not JSON: %v", err)
		}
		records = append(records, rec)
	}
	if hex.EncodeToString(digest.Sum(nil)) != manifest["records_sha256"] {
		return fail("records do not match the manifest digest")
	}
	if manifest["record_count"] != float64(len(records)) {
		return fail("manifest expects %v records, found %d", manifest["record_count"], len(records))
	}
	return manifest, records, nil
}

// readStore is a store step: the reply is {"manifest", "records"} with
// status 200, or {"error": {"code": "invalid_checkpoint_state", "detail"}}
// with 422, as Gym's CheckpointStateError would answer.
func (r *run) readStore(s Step, dir string, m *member, ex *exchange) error {
	manifest, records, err := readParticipantState(dir, m.Kind, m.Instance)
	status := http.StatusOK
	if err != nil {
		status = http.StatusUnprocessableEntity
		ex.reply = map[string]any{"error": map[string]any{"code": "invalid_checkpoint_state", "detail": err.Error()}}
	} else {
		ex.reply = map[string]any{"manifest": manifest, "records": records}
	}
	if want := wantStatus(s); !slices.Contains(want, status) {
		return fmt.Errorf("reading %s/gym/%s/%s as store.py does = %d, want %v: %v", dir, m.Kind, m.Instance, status, want, err)
	}
	return nil
}

// gymEpisodeID checks a value as Gym's EpisodeId validates it
// (nemo_gym/episode_types.py: extra fields forbidden, rollout_id matching
// the id pattern and free of the -a<N> suffix, attempt >= 0) and returns
// its capture key.
func gymEpisodeID(v any) (string, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return "", fmt.Errorf("episode_id %s is not an object", short(v))
	}
	for k := range m {
		if k != "rollout_id" && k != "attempt" {
			return "", fmt.Errorf("episode_id has field %q, which EpisodeId forbids", k)
		}
	}
	id, ok := m["rollout_id"].(string)
	if !ok || !gymNamePattern.MatchString(id) || regexp.MustCompile(`-a[1-9][0-9]*$`).MatchString(id) {
		return "", fmt.Errorf("episode_id.rollout_id %s is not a rollout id", short(m["rollout_id"]))
	}
	attempt := 0.0
	if a, present := m["attempt"]; present {
		f, ok := a.(float64)
		if !ok || f < 0 || f != math.Trunc(f) {
			return "", fmt.Errorf("episode_id.attempt %s is not an integer >= 0", short(a))
		}
		attempt = f
	}
	if attempt == 0 {
		return id, nil
	}
	return fmt.Sprintf("%s-a%d", id, int(attempt)), nil
}

// checkGymStore checks a store step's records: each a JSON object whose
// episode_id Gym's EpisodeId validates, as the restore's _record_key
// (control.py) and the adapter's _legacy_agent_capture_keys read it.
func checkGymStore(ex *exchange) error {
	recs, _ := ex.reply.(map[string]any)["records"].([]any)
	for i, rec := range recs {
		m, ok := rec.(map[string]any)
		if !ok {
			return fmt.Errorf("record %d is not an object", i)
		}
		if _, err := gymEpisodeID(m["episode_id"]); err != nil {
			return fmt.Errorf("record %d: %w", i, err)
		}
	}
	return nil
}

// checkGymStatus is what coordination.discover reads of a status reply
// (kind, one of PREPARE_ORDER) and the fields control.py's status()
// always has.
func checkGymStatus(ex *exchange) error {
	st, ok := ex.reply.(map[string]any)
	if !ok {
		return errors.New("the status is not an object")
	}
	if err := fields(st, "status", "kind", "string", "instance", "string", "phase", "string", "checkpoint_id", "any", "lease_expires_at", "any", "retired_rollouts", "int", "report", "object"); err != nil {
		return err
	}
	if !slices.Contains(prepareOrder, st["kind"].(string)) {
		return fmt.Errorf("kind %q is not one of %v", st["kind"], prepareOrder)
	}
	if st["kind"] != ex.member.Kind || st["instance"] != ex.member.Instance {
		return fmt.Errorf("status names %v/%v, discovery found %s/%s", st["kind"], st["instance"], ex.member.Kind, ex.member.Instance)
	}
	return checkGymReport(st["report"])
}

// checkGymReport is PrepareReport (control.py): ready, blockers (capture
// keys, at most MAX_REPORTED_BLOCKERS), blocker_count, counts (str -> int),
// restarts (capture keys, which PrepareResult.restarts parses).
func checkGymReport(v any) error {
	rep, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("report %s is not an object", short(v))
	}
	if err := fields(rep, "report", "ready", "bool", "blockers", "array", "blocker_count", "int", "counts", "object", "restarts", "array"); err != nil {
		return err
	}
	blockers := rep["blockers"].([]any)
	if len(blockers) > 100 || rep["blocker_count"].(float64) < float64(len(blockers)) {
		return fmt.Errorf("%d blockers listed of blocker_count %v", len(blockers), rep["blocker_count"])
	}
	for k, c := range rep["counts"].(map[string]any) {
		if err := checkType("int", c); err != nil {
			return fmt.Errorf("counts.%s: %v", k, err)
		}
	}
	for _, list := range []string{"blockers", "restarts"} {
		for _, k := range rep[list].([]any) {
			if _, ok := k.(string); !ok {
				return fmt.Errorf("%s holds %s, not a capture key", list, short(k))
			}
		}
	}
	return nil
}

// checkAdapterCommit is every check NeMo RL's adapter makes of one
// participant's commit reply (gym_checkpoint_adapter.py @ 260393bf389c,
// _commit_summary and _participant_manifest): phase committed; episode_ids
// a list of capture keys without duplicates, all in the requested scope;
// the manifest's schema_version an int, kind the participant's, instance a
// non-empty string, checkpoint_id the requested one, records_file and
// records_sha256 non-empty strings, record_count an int >= 0. A model's
// staging_keys are strings without duplicates and staging_keys_by_episode
// attributes exactly them. An agent's records, read back as the adapter
// reads them, match the reply's digest and name no legacy episode the
// reply leaves out.
func checkAdapterCommit(ex *exchange) error {
	rep, ok := ex.reply.(map[string]any)
	if !ok {
		return errors.New("the commit reply is not an object")
	}
	if rep["phase"] != "committed" {
		return fmt.Errorf("phase %v, want committed", rep["phase"])
	}
	body, _ := ex.body.(map[string]any)
	requested := map[string]bool{}
	if ids, ok := body["episode_ids"].([]any); ok {
		for _, id := range ids {
			k, err := gymEpisodeID(id)
			if err != nil {
				return fmt.Errorf("requested scope: %v", err)
			}
			requested[k] = true
		}
	}
	exported, ok := rep["episode_ids"].([]any)
	if !ok {
		return fmt.Errorf("episode_ids %s is not a list", short(rep["episode_ids"]))
	}
	keys := map[string]bool{}
	for _, k := range exported {
		s, ok := k.(string)
		if !ok {
			return fmt.Errorf("episode_ids holds %s", short(k))
		}
		if keys[s] {
			return fmt.Errorf("episode_ids lists %s twice", s)
		}
		keys[s] = true
		if body["episode_ids"] != nil && !requested[s] {
			return fmt.Errorf("exported %s outside the requested scope", s)
		}
	}
	man, ok := rep["manifest"].(map[string]any)
	if !ok {
		return errors.New("no manifest")
	}
	if sv, ok := man["schema_version"].(float64); !ok || sv != math.Trunc(sv) {
		return fmt.Errorf("manifest.schema_version %s is not an int", short(man["schema_version"]))
	}
	if man["kind"] != ex.member.Kind {
		return fmt.Errorf("manifest.kind %v, want %s", man["kind"], ex.member.Kind)
	}
	if inst, _ := man["instance"].(string); inst == "" {
		return fmt.Errorf("manifest.instance %s", short(man["instance"]))
	}
	if man["checkpoint_id"] != body["checkpoint_id"] {
		return fmt.Errorf("manifest.checkpoint_id %v, want %v", man["checkpoint_id"], body["checkpoint_id"])
	}
	for _, f := range []string{"records_file", "records_sha256"} {
		if s, _ := man[f].(string); s == "" {
			return fmt.Errorf("manifest.%s %s", f, short(man[f]))
		}
	}
	if n, ok := man["record_count"].(float64); !ok || n < 0 || n != math.Trunc(n) {
		return fmt.Errorf("manifest.record_count %s", short(man["record_count"]))
	}
	switch ex.member.Kind {
	case "model":
		staging, ok := rep["staging_keys"].([]any)
		if !ok {
			return fmt.Errorf("staging_keys %s is not a list", short(rep["staging_keys"]))
		}
		set := map[string]bool{}
		for _, k := range staging {
			s, ok := k.(string)
			if !ok || set[s] {
				return fmt.Errorf("staging_keys: %s is not a string listed once", short(k))
			}
			set[s] = true
		}
		byEpisode, ok := rep["staging_keys_by_episode"].(map[string]any)
		if !ok {
			return fmt.Errorf("staging_keys_by_episode %s is not an object", short(rep["staging_keys_by_episode"]))
		}
		attributed := map[string]bool{}
		for ep, list := range byEpisode {
			arr, ok := list.([]any)
			if !ok {
				return fmt.Errorf("staging_keys_by_episode.%s is not a list", ep)
			}
			for _, k := range arr {
				s, ok := k.(string)
				if !ok {
					return fmt.Errorf("staging_keys_by_episode.%s holds %s", ep, short(k))
				}
				attributed[s] = true
			}
		}
		if len(attributed) != len(set) {
			return fmt.Errorf("staging_keys_by_episode attributes %d keys, staging_keys lists %d", len(attributed), len(set))
		}
		for k := range attributed {
			if !set[k] {
				return fmt.Errorf("staging_keys_by_episode attributes %s, which staging_keys does not list", k)
			}
		}
	case "agent":
		if len(keys) == 0 {
			return nil
		}
		dir, _ := body["checkpoint_dir"].(string)
		stored, records, err := readParticipantState(dir, "agent", man["instance"].(string))
		if err != nil {
			return err
		}
		if stored["records_sha256"] != man["records_sha256"] {
			return errors.New("the agent's records on disk do not match the commit reply")
		}
		for _, rec := range records {
			m, _ := rec.(map[string]any)
			if m == nil || m["episode"] == nil {
				continue
			}
			k, err := gymEpisodeID(m["episode_id"])
			if err != nil {
				return err
			}
			if !keys[k] {
				return fmt.Errorf("the agent's records name legacy episode %s, absent from its commit reply", k)
			}
		}
	}
	return nil
}

func wantStatus(s Step) []int {
	if len(s.StatusIn) > 0 {
		return s.StatusIn
	}
	if s.Status != 0 {
		return []int{s.Status}
	}
	return []int{http.StatusOK}
}

// async steps' state, on run.
type asyncSteps struct {
	async    sync.WaitGroup
	asyncCtx context.Context
}
