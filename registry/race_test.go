//go:build race

package registry_test

// raceEnabled is true under the race detector, which makes the convergence
// test's many requests several times slower.
const raceEnabled = true
