package resources

import "github.com/gymfleet/gymfleet/pkg/ctlplane"

// Participant is the server's checkpoint participant (checkpointing on),
// for the benchmarks that drive Export and Install directly.
func Participant(s *Server) ctlplane.Participant { return &participant{s: s, ck: s.ckpt} }
