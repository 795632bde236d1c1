"""The streaming kernel: every family token by token, flags on one kernel."""
