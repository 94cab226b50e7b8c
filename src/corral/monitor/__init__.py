"""Monitoring: metrics, GPU providers, health checks, alerts and notification channels."""
