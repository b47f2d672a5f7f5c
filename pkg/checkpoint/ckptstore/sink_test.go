package ckptstore

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"testing"
)

// The sink hands every byte, in order, to its writer and its digest, over
// more chunks than it keeps (so freed mapped chunks are filled again); once
// stopped, which unmaps them, it refuses bytes instead of touching them,
// whether it finished first or was stopped part way.
func TestRecordsSink_EveryByteOnceThenNoneAfterStop(t *testing.T) {
	line := bytes.Repeat([]byte("0123456789abcdef"), 4099)
	for _, finishFirst := range []bool{true, false} {
		var out bytes.Buffer
		s := newRecordsSink(&out)
		var want []byte
		for len(want) < (sinkChunks+2)*sinkChunk {
			if err := s.write(line); err != nil {
				t.Fatal(err)
			}
			if err := s.writeByte('\n'); err != nil {
				t.Fatal(err)
			}
			want = append(append(want, line...), '\n')
		}
		if finishFirst {
			sum, err := s.finish()
			if err != nil {
				t.Fatal(err)
			}
			if whole := sha256.Sum256(want); !bytes.Equal(sum, whole[:]) || !bytes.Equal(out.Bytes(), want) {
				t.Fatalf("the sink wrote %d bytes (digest %x) of the %d written to it (digest %x)", out.Len(), sum, len(want), whole)
			}
		}
		s.stop()
		s.stop()
		if err := s.write(line); !errors.Is(err, ErrStopped) {
			t.Fatalf("finished first %v: write after stop = %v, want ErrStopped", finishFirst, err)
		}
		if err := s.writeByte('\n'); !errors.Is(err, ErrStopped) {
			t.Fatalf("finished first %v: writeByte after stop = %v, want ErrStopped", finishFirst, err)
		}
	}
}
