"""The HTTP service (FastAPI): app factory and routes (`app`), configuration (`config`),
middleware, handlers, the OpenAPI document and the HTML pages. Nothing outside the
HTTP server imports this package: pool workers, the CLI, batch jobs and the torch
backend use service.pipeline and service.prepare, which do not import FastAPI."""
from service.http.app import app_from_env, create_app
from service.http.config import DEFAULT_MAX_BODY_BYTES, ServiceConfig, config_from_env

__all__ = ["app_from_env", "create_app", "DEFAULT_MAX_BODY_BYTES", "ServiceConfig", "config_from_env"]
