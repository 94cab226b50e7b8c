"""Job isolation for the local engine: bubblewrap sandboxes and cgroup limits.

Kept import-free on purpose: the supervisor process imports `cgroupfs` from here at every job
start, and a package import that pulled in the rest of Corral would cost start-up latency.
"""
