package environment

import "context"

// CPUGateSlots is how many /run handlers the server's CPU gate admits at once.
func CPUGateSlots(s *Server) int { return cap(s.cpu) }

// CPUGateTaken is how many slots of the server's CPU gate are taken.
func CPUGateTaken(s *Server) int { return len(s.cpu) }

// TakeCPUGateSlot takes one slot of the server's CPU gate, as a /run
// decoding its body does, and returns the function that frees it.
func TakeCPUGateSlot(s *Server) (leave func()) {
	if err := s.cpu.enter(context.Background()); err != nil {
		panic(err) // a background context never ends
	}
	return s.cpu.leave
}

// LateCleanupPending is how many final-cleanup steps the server's late
// cleanup has waiting to be sent again or being sent.
func LateCleanupPending(s *Server) int { return s.late.Pending() }
