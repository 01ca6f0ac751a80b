"""The steprec recorder daemon: OTLP ingest into DuckDB, and the query service, on one gRPC port."""

from .daemon.server import Recorder, ServeOptions, serve

__all__ = ["Recorder", "ServeOptions", "serve"]
