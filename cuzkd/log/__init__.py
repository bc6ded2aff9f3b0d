"""cuzkd's own logging: structured set-up, engine lines re-logged, the bounded queue and its writer
thread, rate limits for repeated events."""
