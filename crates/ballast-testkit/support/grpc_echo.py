"""gRPC echo upstream and client for ballast end-to-end tests (grpcio, no generated code).

serve NAME             answer every unary method with JSON {backend, method, metadata};
                       prints the bound port on stdout, then serves until killed.
call ADDR AUTHORITY METHOD N [KEY=VALUE ...]
                       N unary calls of METHOD (e.g. /pkg.Svc/Echo) with the given metadata;
                       prints one JSON line per call: {"ok": true, "reply": {...}} or
                       {"ok": false, "code": "UNIMPLEMENTED", "details": "..."}.
"""
import json
import sys
from concurrent import futures

import grpc


def serve(name):
    class Echo(grpc.GenericRpcHandler):
        def service(self, details):
            method = details.method

            def answer(request, context):
                md = {k: v for k, v in context.invocation_metadata()}
                context.set_trailing_metadata((("x-backend", name),))
                return json.dumps({"backend": name, "method": method, "metadata": md}).encode()

            return grpc.unary_unary_rpc_method_handler(answer)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Echo(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


def call(addr, authority, method, n, pairs):
    metadata = [tuple(p.split("=", 1)) for p in pairs]
    with grpc.insecure_channel(addr, options=[("grpc.default_authority", authority)]) as ch:
        stub = ch.unary_unary(method)
        for _ in range(n):
            try:
                reply, c = stub.with_call(b"ping", metadata=metadata, timeout=10)
                out = {"ok": True, "reply": json.loads(reply)}
                out["trailers"] = {k: v for k, v in (c.trailing_metadata() or ())}
                out["headers"] = {k: v for k, v in (c.initial_metadata() or ())}
            except grpc.RpcError as e:
                out = {"ok": False, "code": e.code().name, "details": e.details() or ""}
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        call(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6:])
