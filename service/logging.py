"""Structured JSON logs: one JSON object per line on stderr.

Call sites pass their fields as `extra={"fields": {...}}`; the formatter merges them into
the record, so a compile logs `graph_hash`, `planner`, `status`, `gap`, `seconds` as
top-level keys that a log pipeline can filter on.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LOGGER_NAME = "sticksat.service"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def get_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)


def configure(level: str = "info", stream=None) -> logging.Logger:
    """Route the service logger (and uvicorn's) through the JSON formatter. Idempotent."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    numeric = getattr(logging, level.upper(), logging.INFO)
    for name in (LOGGER_NAME, "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(numeric)
        logger.propagate = False
    # The access log duplicates what the service logs per request with more context.
    logging.getLogger("uvicorn.access").disabled = True
    return get_logger()


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    get_logger().log(level, event, extra={"fields": fields})
