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

# Starting, stopping and sampling one target of bench-peers.sh and bench-profile.sh (each
# alone on core 0). The caller sets: riser (the binary), sock (the RPC socket), work (a
# scratch directory holding riser.json, the config of riser), out (logs), riser_port,
# spdk_port, spdk_dir (start.sh), SPDK_PREFIX, spdk_bdev (the bdev RPC and its arguments for
# rpc.py), and for tgt lib-tgt.sh's tgt_start/tgt_stop; pid (or tgt_pid) is the target's.
start_target() { # NAME ROUND: starts it alone on core 0, configured with the LUN
  case "$1" in
    riser)
      rm -f "$sock"
      taskset -c 0 "$riser" -m 0x1 --poll-mode busy -r "$sock" --json "$work/riser.json" >"$out/riser.$2.log" 2>&1 &
      pid=$!
      wait_port $riser_port "$pid" riser "$out/riser.$2.log"
      for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
      ;;
    spdk|spdk-uring)
      local r=(env PYTHONPATH="$SPDK_PREFIX/python" python3 "$SPDK_PREFIX/scripts/rpc.py" -s "$sock")
      if [ "$1" = spdk ]; then
        # start.sh: iscsi_tgt --no-huge -s 2048 -u -m MASK (no hugepages, nothing on the machine
        # changes); taskset keeps DPDK's side threads on core 0 too. Its default socket
        # implementation: posix.
        pid=$(taskset -c 0 "$spdk_dir/start.sh" "$sock" 0x1) || die "SPDK's iscsi_tgt did not start; see $sock.log"
      else
        # The same flags as start.sh, waiting for RPCs: sock_set_default_impl is a startup
        # RPC, taken only before framework_start_init.
        rm -f "$sock"
        LD_LIBRARY_PATH=$SPDK_PREFIX/build/lib setsid taskset -c 0 "$SPDK_PREFIX/build/bin/iscsi_tgt" \
          --no-huge -s 2048 -u -m 0x1 -r "$sock" --wait-for-rpc >"$sock.log" 2>&1 </dev/null &
        pid=$!
        for _ in $(seq 100); do [ -S "$sock" ] && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        [ -S "$sock" ] || die "SPDK's iscsi_tgt (for its uring sockets) did not start; see $sock.log"
        { "${r[@]}" sock_set_default_impl -i uring && "${r[@]}" framework_start_init; } >"$out/$1.$2.rpc.log" 2>&1 ||
          { cp "$sock.log" "$out/$1.$2.log"; die "SPDK's uring socket implementation is not available; see $out/$1.$2.rpc.log"; }
      fi
      {
        "${r[@]}" -t 60 framework_wait_init &&
        "${r[@]}" "${spdk_bdev[@]}" &&
        "${r[@]}" iscsi_create_portal_group 1 "127.0.0.1:$spdk_port" &&
        "${r[@]}" iscsi_create_initiator_group 1 ANY ANY &&
        "${r[@]}" iscsi_create_target_node null null_alias Null0:0 1:1 64 -d
      } >>"$out/$1.$2.rpc.log" 2>&1 || { cp "$sock.log" "$out/$1.$2.log"; die "configuring SPDK failed; see $out/$1.$2.rpc.log and $out/$1.$2.log"; }
      wait_port $spdk_port "$pid" "SPDK's iscsi_tgt" "$sock.log"
      ;;
    tgt)
      tgt_start "$out/tgt.$2.log" >/dev/null
      # Its CPU time is read from /proc/$tgt_pid: that must be tgtd itself.
      [ "$(cat "/proc/$tgt_pid/comm" 2>/dev/null)" = tgtd ] || die "tgtd did not start (or is not pid $tgt_pid); see $out/tgt.$2.log"
      wait_port $tgt_port "$tgt_pid" tgtd "$out/tgt.$2.log"
      ;;
  esac
}

stop_target() { # NAME ROUND
  case "$1" in
    tgt) tgt_stop; tgt_pid= ;;
    *)
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      [[ "$1" = spdk* ]] && cp "$sock.log" "$out/$1.$2.log" 2>/dev/null
      pid=
      ;;
  esac
}

cost_sample() { # NAME -> "COUNTER RATE": reactor busy ticks and tick rate, or tgtd's CPU ticks
  case "$1" in
    tgt) awk -v hz="$(getconf CLK_TCK)" '{print $14 + $15, hz}' "/proc/$tgt_pid/stat" ;;
    *) rpc "$sock" framework_get_reactors |
         python3 -c 'import json,sys; r=json.load(sys.stdin); print(sum(x["busy"] for x in r["reactors"]), r["tick_rate"])' ;;
  esac
}


# Writes $work/riser.json: the bdev of $riser_bdev (a config entry, named Null0) behind target
# "null" (queue depth 64, no CHAP) on 127.0.0.1:$riser_port.
write_riser_config() {
cat > "$work/riser.json" <<JSON
{"subsystems":[{"subsystem":"bdev","config":[$riser_bdev]},
{"subsystem":"iscsi","config":[{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"127.0.0.1","port":"$riser_port"}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"null","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Null0","lun_id":0}],"queue_depth":64,"disable_chap":true}}]}]}
JSON
}
