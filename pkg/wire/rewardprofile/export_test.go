package rewardprofile

// GymFloat is appendGymFloat as a string, for tests.
func GymFloat(f float64) string { return string(appendGymFloat(nil, f)) }
