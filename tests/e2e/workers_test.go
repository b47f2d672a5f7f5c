package e2e

import "testing"

// The scenarios below run again with the model server balancing over two
// fakeinference workers (issue 35): a rollout's calls stay on one worker,
// holds and call logs are read across both (fakes), and a cut prefix staged
// on one worker is continued there after a restore, whichever worker the
// restarted model server tries first.

func TestTwoWorkers_Scenario01_SingleAgentTurnContinuesAfterCrash(t *testing.T) {
	continueAfterCrash(t, "weather_agent", 2)
}

func TestTwoWorkers_Scenario04_TokenLineageContinues(t *testing.T) {
	lineageContinues(t, 2)
}

func TestTwoWorkers_Scenario05_GenerationCutIsContinued(t *testing.T) {
	generationCutContinued(t, 2)
}
