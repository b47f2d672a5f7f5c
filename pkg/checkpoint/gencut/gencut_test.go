package gencut_test

import (
	"errors"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
)

func TestParseRequest(t *testing.T) {
	ok := `{"checkpoint_id":"c1","server_name":"policy_model","active":[{"model_call_id":"m1","capture_key":"r-a1"}]}`
	req, err := gencut.ParseLegacyRequest([]byte(ok))
	if err != nil || len(req.Active) != 1 || req.Active[0].CaptureKey != "r-a1" {
		t.Fatalf("ParseLegacyRequest(%s) = %+v, %v", ok, req, err)
	}
	for _, bad := range []string{
		``, `{}`, `{"checkpoint_id":"c1","server_name":"s","active":[],"x":1}`,
		`{"checkpoint_id":"../c","server_name":"s","active":[]}`,
		`{"checkpoint_id":"c1","server_name":"","active":[]}`,
		`{"checkpoint_id":"c1","server_name":"s","active":[{"model_call_id":"m 1","capture_key":"r"}]}`,
		`{"checkpoint_id":"c1","server_name":"s","active":[{"model_call_id":"m","capture_key":"r/x"}]}`,
		`{"checkpoint_id":"c1","server_name":"s","active":[{"model_call_id":"m","capture_key":"r"},{"model_call_id":"m","capture_key":"r"}]}`,
	} {
		if _, err := gencut.ParseLegacyRequest([]byte(bad)); !apierror.HasCode(err, apierror.InvalidRequest) {
			t.Errorf("ParseLegacyRequest(%s) = %v, want invalid_request", bad, err)
		}
	}
}

func TestDecodeReceipt(t *testing.T) {
	key := gencut.StagingKey("r-a1", "m1")
	if key != "__generation_cut__/r-a1/m1" || !gencut.ValidStagingKey(key) {
		t.Fatalf("staging key %q", key)
	}
	good := `{"checkpoint_id":"c1","cut_id":"x","prefixes":[` +
		`{"model_call_id":"m1","capture_key":"r-a1","disposition":"durable_prefix","staging_key":"` + key + `","prefix_token_count":3,"prefix_digest":"d"},` +
		`{"model_call_id":"m2","capture_key":"r","disposition":"durable_failure","reason":"held"}]}`
	rc, err := gencut.DecodeLegacyReceipt([]byte(good), 2)
	if err != nil || len(rc.Prefixes) != 2 {
		t.Fatalf("DecodeLegacyReceipt = %+v, %v", rc, err)
	}
	for _, bad := range []string{
		`not json`,
		`{"prefixes":[{"model_call_id":"m1","disposition":"durable_prefix","prefix_token_count":3,"prefix_digest":"d"}]}`,
		`{"prefixes":[{"model_call_id":"m1","disposition":"durable_prefix","staging_key":"k","prefix_token_count":0,"prefix_digest":"d"}]}`,
		`{"prefixes":[{"model_call_id":"m1","disposition":"durable_failure","staging_key":"k"}]}`,
		`{"prefixes":[{"model_call_id":"m1","disposition":"maybe"}]}`,
		`{"prefixes":[{"model_call_id":"","disposition":"durable_failure"}]}`,
	} {
		if _, err := gencut.DecodeLegacyReceipt([]byte(bad), 1); !errors.Is(err, gencut.ErrMalformedLegacyReceipt) {
			t.Errorf("DecodeLegacyReceipt(%s) = %v, want ErrMalformedLegacyReceipt", bad, err)
		}
	}
}
