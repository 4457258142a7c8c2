package fetch

// SetResumeChunk sets how many of a run's items a resume reads at a time,
// and returns what puts it back.
func SetResumeChunk(n int) (restore func()) {
	was := resumeChunk
	resumeChunk = n
	return func() { resumeChunk = was }
}
