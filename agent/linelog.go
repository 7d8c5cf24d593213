package agent

import (
	"log"
	"log/slog"
	"strings"
	"unicode"
)

// lineLogger is a log.Logger for a library's own lines (net/http's server
// errors): each becomes a WARN line of msg, one per cause per interval.
func (l *limitedLog) lineLogger(msg string) *log.Logger {
	return log.New(lineWriter{l, msg}, "", 0)
}

type lineWriter struct {
	l   *limitedLog
	msg string
}

func (w lineWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	w.l.Log(slog.LevelWarn, w.msg+"\x00"+lineCause(line), w.msg, "err", line)
	return len(p), nil
}

// lineCause is what names a line's cause: its text up to the first digit
// ("http: Accept error: accept tcp " for every accept error, whatever the
// address or the retry delay), at most 80 bytes.
func lineCause(s string) string {
	if i := strings.IndexFunc(s, unicode.IsDigit); i >= 0 {
		s = s[:i]
	}
	return s[:min(len(s), 80)]
}
