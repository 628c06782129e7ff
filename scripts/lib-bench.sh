#!/usr/bin/env bash
# Helpers shared by the benchmark scripts (sourced; they define die()).

# A JSON-RPC 2.0 call over a UNIX socket (riser and SPDK both speak it): SOCK METHOD
# [PARAMS-JSON]; prints the result. RPC_TIMEOUT seconds (default 10).
rpc() {
  RPC_TIMEOUT=${RPC_TIMEOUT:-10} python3 - "$@" <<'PY'
import json, os, socket, sys
sock, method = sys.argv[1], sys.argv[2]
req = {"jsonrpc": "2.0", "id": 1, "method": method}
if len(sys.argv) > 3: req["params"] = json.loads(sys.argv[3])
s = socket.socket(socket.AF_UNIX); s.settimeout(float(os.environ["RPC_TIMEOUT"])); s.connect(sock)
s.sendall(json.dumps(req).encode() + b"\n")
buf, dec = b"", json.JSONDecoder()
while True:
    chunk = s.recv(65536)
    if not chunk: sys.exit(f"rpc {method}: connection closed without a reply")
    buf += chunk
    try: reply, _ = dec.raw_decode(buf.decode().lstrip()); break
    except ValueError: continue
if "error" in reply: sys.exit(f"rpc {method}: {reply['error']}")
print(json.dumps(reply["result"]))
PY
}

# Waits until 127.0.0.1:PORT accepts connections: PORT PID NAME LOG (dies if PID exits, or
# after 30 s).
wait_port() {
  for _ in $(seq 300); do
    (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || die "$3 exited while starting; see $4"
    sleep 0.1
  done
  die "$3 does not listen on 127.0.0.1:$1 after 30 s; see $4"
}
