"""Wire definitions steprec adds to OTLP: the query service `steprec.query.v1`.

The `.proto` sources live beside their generated modules; regenerate with
`python scripts/gen_proto.py`. Ingest uses OTLP's own protos from
`opentelemetry-proto`, never a fork of them.
"""
