"""Client-side TLS settings shared by the exporter and the query client."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class ClientTLS:
    """PEM files for talking to a recorder over TLS; `cert` and `key` add a client certificate (mTLS)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a client certificate needs both tls_cert and tls_key")
        for path in (self.ca, self.cert, self.key):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"TLS file {path} does not exist")

    @property
    def configured(self) -> bool:
        return any((self.ca, self.cert, self.key))

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return Path(path).read_bytes() if path is not None else None

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))
