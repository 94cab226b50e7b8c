"""Example jobs shipped with Corral (the demo submits `digits.yaml`)."""
