"""Entering running jobs from outside: the SSH gateway (ssh.py), the process plumbing shared with
the exec WebSocket (spawn.py) and the login-to-job resolution (resolver.py)."""
