package control

import "sort"

// Report is a participant's readiness report.
type Report struct {
	Ready        bool           `json:"ready"`
	Blockers     []string       `json:"blockers"`
	BlockerCount int            `json:"blocker_count"`
	Counts       map[string]int `json:"counts"`
	Restarts     []string       `json:"restarts"`
}

// MaxBlockers is how many blockers a reply lists; the count is always full.
const MaxBlockers = 100

// Blockers sorts keys and keeps at most limit of them, the way every report
// lists its blockers.
func Blockers(keys []string, limit int) (listed []string, count int) {
	sort.Strings(keys)
	count = len(keys)
	if limit >= 0 && len(keys) > limit {
		keys = keys[:limit]
	}
	if keys == nil {
		keys = []string{}
	}
	return keys, count
}
