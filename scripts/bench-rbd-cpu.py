#!/usr/bin/env python3
"""CPU time of every party of an RBD benchmark run (bench-rbd.sh), over a window of the run.

    bench-rbd-cpu.py DELAY SECS CEPH_DIR DRIVER_PID|- OUT

Sleeps DELAY seconds, then counts for SECS seconds the CPU (user + system, /proc/PID/task/*/stat)
of: the test cluster's daemons (processes whose command line names CEPH_DIR: ceph-osd,
ceph-mon, ceph-mgr), the process that drives librbd (DRIVER_PID; with `-`, the `rbd` or
`rbd_qd` process whose command line names CEPH_DIR), split by thread: the reactor
(reactor_*), librados' messenger (msgr-worker-*), librbd's io_context_pool and the rest; the
client (riser-perf processes); and the whole machine's user, system, softirq and idle time
(/proc/stat: other processes on a shared box show up there). Writes JSON to OUT: seconds
measured and CPU seconds by party. The caller divides by the I/O done in the window.
"""
import json
import os
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def thread_class(comm):
    for prefix, name in (("reactor", "reactor"), ("msgr-worker", "msgr"), ("io_context", "io_context")):
        if comm.startswith(prefix):
            return name
    return "other"


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def snap(ceph_dir, driver):
    """{(party, thread class, tid): ticks} and /proc/stat's cpu line."""
    d = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        comm, cmd = read(f"/proc/{p}/comm"), read(f"/proc/{p}/cmdline")
        if comm is None or cmd is None:
            continue
        comm = comm.strip()
        if comm in ("ceph-osd", "ceph-mon", "ceph-mgr") and ceph_dir in cmd:
            party = comm
        elif (driver == p) or (driver == "-" and comm in ("rbd", "rbd_qd") and ceph_dir in cmd):
            party = "driver"
        elif comm == "riser-perf":
            party = "client"
        else:
            continue
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            s, tc = read(f"/proc/{p}/task/{t}/stat"), read(f"/proc/{p}/task/{t}/comm")
            if s is None or tc is None:
                continue
            f = s[s.rindex(")") + 2:].split()
            cls = thread_class(tc.strip()) if party == "driver" else ""
            d[(party, cls, t)] = int(f[11]) + int(f[12])
    cpu = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return d, cpu


def main():
    delay, secs, ceph_dir, driver, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    time.sleep(delay)
    a, ca = snap(ceph_dir, driver)
    t0 = time.monotonic()
    time.sleep(secs)
    b, cb = snap(ceph_dir, driver)
    t1 = time.monotonic()
    cpu = {}
    for (party, cls, tid), ticks in b.items():
        # A thread that started in the window counts from zero.
        dt = ticks - a.get((party, cls, tid), 0)
        key = f"{party}:{cls}" if cls else party
        cpu[key] = cpu.get(key, 0) + dt / HZ
        if cls:
            cpu["driver"] = cpu.get("driver", 0) + dt / HZ
    for i, name in ((0, "machine:user"), (2, "machine:system"), (6, "machine:softirq"), (3, "machine:idle")):
        cpu[name] = (cb[i] - ca[i]) / HZ
    with open(out, "w") as f:
        json.dump({"secs": t1 - t0, "cpu": cpu}, f)


if __name__ == "__main__":
    main()
