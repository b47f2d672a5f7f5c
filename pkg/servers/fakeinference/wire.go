package fakeinference

import (
	"net/http"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference/fiwire"
)

// The control routes' bodies and the policy script are the wire contract's
// (fiwire); these names keep the server's view of them.
type (
	HoldRequest         = fiwire.HoldRequest
	HoldReply           = fiwire.HoldReply
	ReleaseRequest      = fiwire.ReleaseRequest
	ReleaseReply        = fiwire.ReleaseReply
	CallCount           = fiwire.CallCount
	CallInfo            = fiwire.CallInfo
	CallRequest         = fiwire.CallRequest
	CallsReply          = fiwire.CallsReply
	CutsReply           = fiwire.CutsReply
	ScriptReply         = fiwire.ScriptReply
	ResetReply          = fiwire.ResetReply
	Script              = fiwire.Script
	ScriptToolCall      = fiwire.ScriptToolCall
	ScriptStreamError   = fiwire.ScriptStreamError
	ScriptTruncate      = fiwire.ScriptTruncate
	ScriptRoutedExperts = fiwire.ScriptRoutedExperts
	// Control is the client of the control routes (fiwire.Control).
	Control = fiwire.Control
)

// Limits of a Script and where routed_experts goes in a reply (fiwire's).
const (
	MaxRoutedExpertsBytes  = fiwire.MaxRoutedExpertsBytes
	MaxGeneratedRoutes     = fiwire.MaxGeneratedRoutes
	RoutedExpertsInMessage = fiwire.RoutedExpertsInMessage
	RoutedExpertsInChoice  = fiwire.RoutedExpertsInChoice
	RoutedExpertsInBoth    = fiwire.RoutedExpertsInBoth
)

// ParseScript decodes and normalises a script from JSON text (fiwire.ParseScript).
func ParseScript(text string) (*Script, error) { return fiwire.ParseScript(text) }

// NewControl returns a Control for the server at baseURL (fiwire.NewControl).
func NewControl(baseURL string, hc *http.Client) *Control { return fiwire.NewControl(baseURL, hc) }
