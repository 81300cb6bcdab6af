"""Human-facing HTML pages of the service: the store's index and each stored program's
report. Kept apart from the JSON API in app.py; included by `create_app`."""
from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
