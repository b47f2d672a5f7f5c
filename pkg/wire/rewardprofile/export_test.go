package rewardprofile

// PyFloat is appendPyFloat as a string, for tests.
func PyFloat(f float64) string { return string(appendPyFloat(nil, f)) }
