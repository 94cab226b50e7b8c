"""Placeholder: monitoring's HTTP routes (alerts, webhook, /metrics) are added here."""

from fastapi import APIRouter

router = APIRouter()
