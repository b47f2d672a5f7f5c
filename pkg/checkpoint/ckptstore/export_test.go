package ckptstore

import (
	"context"

	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// ReadRecordsBytes exposes the records reader to the fuzz test.
func ReadRecordsBytes(b []byte) ([]Record, int, error) {
	recs, n, _, err := readRecords(context.Background(), b, func(rollout.EpisodeID) bool { return true }, 0)
	return recs, n, err
}

// ReadCanonical, DecodeLine and AppendRecord expose the records line codec
// to tests.
func ReadCanonical(line []byte) (Record, bool) { return readCanonical(line) }

func DecodeLine(line []byte) (Record, error) { return decodeLine(line) }

func AppendRecord(r Record) ([]byte, error) { return appendRecord(nil, r) }

// WritebackEvery is how many bytes of records are written between two
// background writebacks.
const WritebackEvery = writebackEvery
