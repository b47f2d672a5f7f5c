// Package gencut is the generation-cut contract between the policy model
// server and an inference worker (SPEC §6): when a checkpoint closes
// admission, the model server asks the worker to stop the generations still
// running and stage their prefixes; the receipt names where each prefix is
// staged, and a re-issued call continues one by naming its staging key. The
// model server (the client) and the workers (fakeinference, vllmcut) share
// these types, so the wire contract is written once.
//
// The wire is NeMo Gym's (inventory.go): a GenerationCutInventory posted to
// Path, a GenerationCutReceipt back. The Legacy* types are the shape our
// workers took before, which they still serve on LegacyPath (and on Path,
// told apart by its "active" list) for a model server of an earlier
// release.
package gencut

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Path is the worker's route, under its root URL (the OpenAI base URL
// without its trailing /v1), NeMo Gym's GENERATION_CUT_ROUTE
// (nemo_gym/_checkpoint/generation_cut.py @ 807db7d5bd6d), the route NeMo
// RL's generation workers serve. It takes the worker's bearer token.
const Path = "/ng-control/v1/generation-cut"

// LegacyPath is the route our workers served before; fakeinference still
// serves it, so a model server of an earlier release keeps its cuts.
const LegacyPath = "/_ckpt/generation-cut"

// Headers of a call that was cut or that continues a cut.
const (
	// HeaderContinueCut on a call asks the worker to continue the prefix
	// staged under the given key instead of generating from scratch.
	HeaderContinueCut = "X-Ng-Continue-Cut"
	// HeaderGenerationCut on a worker's reply says the generation was cut
	// and names the staging key of its prefix.
	HeaderGenerationCut = "X-Ng-Generation-Cut"
)

// Dispositions of a receipt entry.
const (
	DispositionDurablePrefix  = "durable_prefix"
	DispositionDurableFailure = "durable_failure"
)

// MaxActive bounds the calls one request may list.
const MaxActive = 100000

// StagingKeyPrefix starts every staging key.
const StagingKeyPrefix = "__generation_cut__/"

// StagingKey is where a cut call's prefix is staged:
// __generation_cut__/<capture_key>/<model_call_id>.
func StagingKey(captureKey, modelCallID string) string {
	return StagingKeyPrefix + captureKey + "/" + modelCallID
}

// LegacyRequest is the body of POST LegacyPath, our former shape.
type LegacyRequest struct {
	CheckpointID string             `json:"checkpoint_id"`
	ServerName   string             `json:"server_name"`
	Active       []LegacyActiveCall `json:"active"`
}

// LegacyActiveCall names one call to cut.
type LegacyActiveCall struct {
	ModelCallID string `json:"model_call_id"`
	CaptureKey  string `json:"capture_key"`
}

// LegacyReceipt answers a request: one entry per listed call, in request order.
// Prefixes are staged before the receipt is sent (the worker's durability
// boundary).
type LegacyReceipt struct {
	CheckpointID string         `json:"checkpoint_id"`
	CutID        string         `json:"cut_id"`
	Prefixes     []LegacyPrefix `json:"prefixes"`
}

// LegacyPrefix is one call's outcome: a durable_prefix carries the staging
// fields; a durable_failure carries only its reason.
type LegacyPrefix struct {
	ModelCallID      string `json:"model_call_id"`
	CaptureKey       string `json:"capture_key"`
	Disposition      string `json:"disposition"`
	Reason           string `json:"reason,omitempty"`
	StagingKey       string `json:"staging_key,omitempty"`
	PrefixTokenCount int    `json:"prefix_token_count,omitempty"`
	PrefixDigest     string `json:"prefix_digest,omitempty"`
}

// MaxStagingKey bounds a staging key (it rides in a header).
const MaxStagingKey = 1024

// ValidStagingKey accepts 1 to MaxStagingKey visible ASCII characters.
func ValidStagingKey(k string) bool {
	if k == "" || len(k) > MaxStagingKey {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] >= 0x7f {
			return false
		}
	}
	return true
}

// ValidCallID accepts a model call id: 1 to 256 visible ASCII characters.
func ValidCallID(id string) bool { return len(id) <= 256 && ValidStagingKey(id) }

// ParseLegacyRequest decodes and validates a request body (the worker's side):
// unknown fields are refused, ids are checked, and no call is listed twice.
// Its error is an *apierror.Error answered with 422.
func ParseLegacyRequest(body []byte) (LegacyRequest, error) {
	var req LegacyRequest
	invalid := func(format string, args ...any) error {
		return apierror.New(apierror.InvalidRequest, format, args...).WithStatus(http.StatusUnprocessableEntity)
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return req, invalid("request body is empty; expected a JSON object")
	}
	// The fast strict decoder: a cut round lists every call in flight, and
	// the worker reads it inside a prepare.
	if err := codec.UnmarshalStrictFast(body, &req); err != nil {
		return req, invalid("%s", codec.DescribeError(err))
	}
	if !rollout.ValidID(req.CheckpointID) {
		return req, invalid("checkpoint_id %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", req.CheckpointID)
	}
	if strings.TrimSpace(req.ServerName) == "" || len(req.ServerName) > 256 {
		return req, invalid("server_name must be 1 to 256 characters")
	}
	if len(req.Active) > MaxActive {
		return req, invalid("at most %d active calls per request, got %d", MaxActive, len(req.Active))
	}
	seen := make(map[string]bool, len(req.Active))
	for i, a := range req.Active {
		if !ValidCallID(a.ModelCallID) {
			return req, invalid("active[%d].model_call_id must be 1 to 256 visible characters", i)
		}
		if _, err := rollout.ParseCaptureKey(a.CaptureKey); err != nil {
			return req, invalid("active[%d].capture_key: %v", i, err)
		}
		if seen[a.ModelCallID] {
			return req, invalid("active[%d]: model_call_id %q is listed twice", i, a.ModelCallID)
		}
		seen[a.ModelCallID] = true
	}
	return req, nil
}

// ErrMalformedLegacyReceipt reports a receipt that breaks the contract.
var ErrMalformedLegacyReceipt = errors.New("malformed generation-cut receipt")

// DecodeLegacyReceipt decodes a worker's receipt (the model server's side) and
// checks every entry's shape: a durable_prefix needs a staging key, a
// positive token count and a digest; a durable_failure carries none of
// them. Which entries answer which calls is the caller's to check. listed
// is how many calls the request named, one entry each: the entries are
// decoded into room made for that many rather than a slice grown as they
// come.
func DecodeLegacyReceipt(body []byte, listed int) (*LegacyReceipt, error) {
	rc := LegacyReceipt{Prefixes: make([]LegacyPrefix, 0, min(max(listed, 0), MaxActive))}
	if err := codec.Unmarshal(body, &rc); err != nil {
		return nil, fmt.Errorf("%w: not JSON of the expected shape: %s", ErrMalformedLegacyReceipt, codec.DescribeError(err))
	}
	for i, p := range rc.Prefixes {
		if !ValidCallID(p.ModelCallID) {
			return nil, fmt.Errorf("%w: prefixes[%d].model_call_id is not a model call id", ErrMalformedLegacyReceipt, i)
		}
		switch p.Disposition {
		case DispositionDurablePrefix:
			if !ValidStagingKey(p.StagingKey) || p.PrefixTokenCount <= 0 || p.PrefixDigest == "" || len(p.PrefixDigest) > 256 {
				return nil, fmt.Errorf("%w: prefixes[%d] is a durable_prefix without a staging key, a positive prefix_token_count and a prefix_digest", ErrMalformedLegacyReceipt, i)
			}
		case DispositionDurableFailure:
			if p.StagingKey != "" || p.PrefixTokenCount != 0 || p.PrefixDigest != "" {
				return nil, fmt.Errorf("%w: prefixes[%d] is a durable_failure that carries staging fields", ErrMalformedLegacyReceipt, i)
			}
		default:
			return nil, fmt.Errorf("%w: prefixes[%d].disposition %q is neither durable_prefix nor durable_failure", ErrMalformedLegacyReceipt, i, p.Disposition)
		}
	}
	return &rc, nil
}

// PrefixDigest is the sha256 (hex) of token ids written as a compact JSON
// array, e.g. "[1,2,3]": a receipt's prefix_digest, which is also of the
// 64-hex-digit form upstream's receipt requires.
func PrefixDigest(ids []int) string {
	b := make([]byte, 0, 2+len(ids)*6)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	b = append(b, ']')
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
