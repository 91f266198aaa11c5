"""gRPC echo upstream and client for ballast end-to-end tests (grpcio, no generated code).

serve NAME             answer every unary method with JSON {backend, method, metadata};
                       prints the bound port on stdout, then one JSON line {method, metadata}
                       per call received, until killed.
call [--ca FILE] ADDR AUTHORITY METHOD N [KEY=VALUE ...]
                       N unary calls of METHOD (e.g. /pkg.Svc/Echo) with the given metadata;
                       prints one JSON line per call: {"ok": true, "reply": {...}} or
                       {"ok": false, "code": "UNIMPLEMENTED", "details": "..."}. With --ca:
                       over TLS (SNI = AUTHORITY, server certificate checked against FILE;
                       grpcio requires the server to select ALPN h2).
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
                print(json.dumps({"method": method, "metadata": md}), flush=True)
                context.set_trailing_metadata((("x-backend", name),))
                return json.dumps({"backend": name, "method": method, "metadata": md}).encode()

            return grpc.unary_unary_rpc_method_handler(answer)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Echo(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


def channel(addr, authority, ca):
    options = [("grpc.default_authority", authority)]
    if ca is None:
        return grpc.insecure_channel(addr, options=options)
    with open(ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    options.append(("grpc.ssl_target_name_override", authority))
    return grpc.secure_channel(addr, creds, options=options)


def call(addr, authority, method, n, pairs, ca=None):
    metadata = [tuple(p.split("=", 1)) for p in pairs]
    with channel(addr, authority, ca) as ch:
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
        args, ca = sys.argv[2:], None
        if args[0] == "--ca":
            ca, args = args[1], args[2:]
        call(args[0], args[1], args[2], int(args[3]), args[4:], ca)
