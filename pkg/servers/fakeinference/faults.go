package fakeinference

import (
	"net/http"
	"strconv"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// scriptCallError is the failure a script asks of a call.
func scriptCallError(e *ScriptStreamError) *RequestError {
	re := &RequestError{Status: e.Code, Type: e.Type, Message: e.Message, Param: e.Param}
	if re.Status == 0 {
		re.Status = http.StatusInternalServerError
	}
	if re.Message == "" {
		re.Message = "Internal server error"
	}
	return re
}

// routedExperts is the routed_experts value of a reply whose prompt and
// generation are these ids: the scripted value, or routes generated from
// the ids.
func routedExperts(s *Script, promptIDs []int, gen []genToken) codec.RawMessage {
	if s == nil || len(s.RoutedExperts) == 0 {
		return nil
	}
	if s.RoutedExperts[0] != '{' {
		return s.RoutedExperts
	}
	var g ScriptRoutedExperts
	if err := codec.Unmarshal(s.RoutedExperts, &g); err != nil {
		return nil // validated by Normalize
	}
	b := make([]byte, 0, (len(promptIDs)+len(gen))*(2+g.Layers*(2+g.TopK*6)))
	b = append(b, '[')
	row := func(i, id int) {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		for l := 0; l < g.Layers; l++ {
			if l > 0 {
				b = append(b, ',')
			}
			b = append(b, '[')
			for k := 0; k < g.TopK; k++ {
				if k > 0 {
					b = append(b, ',')
				}
				// TopK consecutive (so distinct) experts, from the token id.
				b = strconv.AppendInt(b, int64((id*7+l*3+k)%g.Experts), 10)
			}
			b = append(b, ']')
		}
		b = append(b, ']')
	}
	for i, id := range promptIDs {
		row(i, id)
	}
	for i, t := range gen {
		row(len(promptIDs)+i, t.id)
	}
	return codec.RawMessage(append(b, ']'))
}

// routedExpertsPlaces reports where the reply carries routed_experts.
func routedExpertsPlaces(s *Script) (message, choice bool) {
	if s == nil || len(s.RoutedExperts) == 0 {
		return false, false
	}
	switch s.RoutedExpertsIn {
	case RoutedExpertsInChoice:
		return false, true
	case RoutedExpertsInBoth:
		return true, true
	}
	return true, false
}
