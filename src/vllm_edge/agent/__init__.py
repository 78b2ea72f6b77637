"""Agent suite: a simulated Android phone, tasks judged by device state, pass rates per build."""
