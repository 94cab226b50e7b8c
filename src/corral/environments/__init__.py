"""The environments catalogue: named, versioned Python environments built by build jobs with uv
and shared by the hash of their resolved lock (docs/catalogues.md, "Environments")."""
