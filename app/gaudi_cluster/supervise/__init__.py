"""Running one attempt: the supervisor, the control server, the outcome."""
