"""Placeholder: the portal's routes (pages and static assets) are added here."""

from fastapi import APIRouter

router = APIRouter()
