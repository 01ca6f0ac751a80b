"""Container health check: ask the recorder's grpc.health.v1 Health service whether it is SERVING.

A TCP probe would pass while the server is still starting or already draining; the
server flips its health status to NOT_SERVING on SIGTERM, so asking gRPC health tells
Docker the truth. Exits 0 only on SERVING, 1 otherwise with the reason on stderr.

Usage: python healthcheck.py [PORT]   (default: $STEPREC_HEALTH_PORT or 4317, on 127.0.0.1)
"""

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

TIMEOUT_SECONDS = 2.0


def main() -> int:
    port = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("STEPREC_HEALTH_PORT", "4317")
    target = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(target) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_SECONDS
            )
    except grpc.RpcError as error:
        print(f"steprec healthcheck: {target} unreachable: {error.code().name} {error.details()}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"steprec healthcheck: {target} is {status}, not SERVING", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
