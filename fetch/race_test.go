//go:build race

package fetch_test

// raceEnabled is true under the race detector, which makes the tests of a
// 100,000-request run take minutes (make test runs them without it).
const raceEnabled = true
