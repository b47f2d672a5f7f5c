package rewardprofile

import (
	"errors"
	"net/http"

	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// Path is the route Gym's rollout collection posts the verify replies to.
const Path = "/aggregate_metrics"

// Handle answers POST /aggregate_metrics from the request alone, as Gym's
// SimpleResourcesServer does: the body within the server's body limit, a
// request Gym's profiler could not compute refused with invalid_request.
func Handle(r *http.Request) (any, error) {
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	vrs, err := DecodeRequest(body)
	if err == nil {
		var out []byte
		if out, err = Compute(vrs); err == nil {
			return codec.RawMessage(out), nil
		}
	}
	return nil, AsAPIError(err)
}

// AsAPIError maps an error of DecodeRequest or Compute to the fleet's:
// invalid_request for a request the profiler cannot compute.
func AsAPIError(err error) error {
	var perr *Error
	if errors.As(err, &perr) {
		return apierror.New(apierror.InvalidRequest, "aggregate_metrics: %s", perr.msg)
	}
	return apierror.Wrap(apierror.Internal, err)
}
