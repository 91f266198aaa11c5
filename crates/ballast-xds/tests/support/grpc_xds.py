"""A real proxyless gRPC xDS client (and a tiny server for it), for ballast-xds tests.

    grpc_xds.py server NAME          serve /ballast.test.Echo/Say on 127.0.0.1:0, print the port,
                                     answer "NAME: <request>"; exit when stdin closes
    grpc_xds.py client TARGET MSG [TIMEOUT]
                                     call Say through TARGET (e.g. xds:///greeter), waiting for the
                                     channel up to TIMEOUT seconds (default 30); print the reply

The client needs a bootstrap: GRPC_XDS_BOOTSTRAP_CONFIG (JSON text) or GRPC_XDS_BOOTSTRAP (a file).
No generated code: the method uses raw bytes, so only `grpcio` is needed.
"""
import sys
from concurrent import futures

import grpc

METHOD = "/ballast.test.Echo/Say"


def serve(name):
    def say(request, context):
        return name.encode() + b": " + request

    handler = grpc.method_handlers_generic_handler(
        "ballast.test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    server.stop(0)


def call(target, message, timeout):
    with grpc.insecure_channel(target) as channel:
        say = channel.unary_unary(METHOD)
        # wait_for_ready: the first call waits while the xDS resolver fetches LDS/RDS/CDS/EDS.
        reply = say(message.encode(), timeout=timeout, wait_for_ready=True)
    print(reply.decode(), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(sys.argv[2])
    elif sys.argv[1] == "client":
        call(sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 30.0)
    else:
        sys.exit(f"unknown mode {sys.argv[1]!r}")
