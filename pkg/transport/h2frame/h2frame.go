// Package h2frame is what pkg/transport/h2client and pkg/transport/h2server both do with
// HTTP/2 frames beyond x/net's framer: writing a header block across
// HEADERS and CONTINUATION frames, taking in a peer's SETTINGS, and
// queuing the frames a read loop answers with for the connection's writer.
package h2frame

import (
	"golang.org/x/net/http2"
)

// RFC 9113's values before a peer's SETTINGS say otherwise.
const (
	InitialWindow    = 65535
	InitialFrameSize = 16384
	// MaxWindow is the largest a flow-control window may grow to.
	MaxWindow = 1<<31 - 1
)

// WriteHeaderBlock writes stream id's encoded header block as a HEADERS
// frame and, past frameSize, CONTINUATION frames; endStream ends the
// stream with it.
func WriteHeaderBlock(fr *http2.Framer, id uint32, block []byte, frameSize int, endStream bool) error {
	first := true
	for first || len(block) > 0 {
		n := min(len(block), frameSize)
		frag := block[:n]
		block = block[n:]
		var err error
		if first {
			err = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndStream: endStream, EndHeaders: len(block) == 0})
			first = false
		} else {
			err = fr.WriteContinuation(id, len(block) == 0, frag)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Peer is what a connection has learned from its peer's SETTINGS.
type Peer struct {
	StreamWindow int64 // SETTINGS_INITIAL_WINDOW_SIZE
	FrameSize    int   // SETTINGS_MAX_FRAME_SIZE
	MaxStreams   int   // SETTINGS_MAX_CONCURRENT_STREAMS
}

// NewPeer is a peer of whose SETTINGS nothing has arrived: RFC 9113's
// values, and maxStreams streams assumed.
func NewPeer(maxStreams int) Peer {
	return Peer{StreamWindow: InitialWindow, FrameSize: InitialFrameSize, MaxStreams: maxStreams}
}

// Apply validates f's settings and applies them. A change of the initial
// stream window is passed to windowDelta first, for the send windows of
// the streams open; its error ends Apply. A header table size the peer set
// is returned for the caller's HPACK encoder, which is the writer's to
// change.
func (p *Peer) Apply(f *http2.SettingsFrame, windowDelta func(int64) error) (tableSize uint32, tableSizeSet bool, err error) {
	err = f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingMaxConcurrentStreams:
			p.MaxStreams = int(min(s.Val, 1<<20))
		case http2.SettingInitialWindowSize:
			if err := windowDelta(int64(s.Val) - p.StreamWindow); err != nil {
				return err
			}
			p.StreamWindow = int64(s.Val)
		case http2.SettingMaxFrameSize:
			p.FrameSize = int(s.Val)
		case http2.SettingHeaderTableSize:
			tableSize, tableSizeSet = s.Val, true
		}
		return nil
	})
	return tableSize, tableSizeSet, err
}
