package ctlplane

// HeldGCPercent is the GOGC a checkpoint's hold defers collections with.
const HeldGCPercent = heldGCPercent
