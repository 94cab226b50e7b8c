"""Failure diagnosis: the exit-spec (why an attempt failed, and whether a retry may help), the
bounded log tail it reads, and the watchers for GPU faults, hangs, stragglers and bad nodes."""
