package telemetry

// LogFinished is logFinished, for tests: it logs run id's end, waiting for
// the store to have it.
var LogFinished = logFinished
