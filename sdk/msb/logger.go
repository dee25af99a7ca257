package msb

// Logger receives the client's diagnostic messages with key/value pairs, in
// the style of log/slog: a *slog.Logger satisfies it.
type Logger interface {
	Debug(msg string, args ...any)
	Info(msg string, args ...any)
	Error(msg string, args ...any)
}

// NoOpLogger discards everything. It is the default [Logger].
type NoOpLogger struct{}

// Debug discards the message.
func (NoOpLogger) Debug(string, ...any) {}

// Info discards the message.
func (NoOpLogger) Info(string, ...any) {}

// Error discards the message.
func (NoOpLogger) Error(string, ...any) {}
