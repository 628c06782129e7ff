#!/usr/bin/env python3
"""Seed corpora for riser's fuzz targets (test/fuzz/) from real iSCSI traffic.

Two parts, driven by scripts/fuzz-seeds.sh:

  fuzz-seeds.py proxy LISTEN_PORT TARGET_PORT DIR
      A recording TCP proxy on 127.0.0.1: every connection is relayed to the target and its
      bytes are appended to DIR/NNNN.i2t (initiator to target) and DIR/NNNN.t2i. Runs until
      killed.

  fuzz-seeds.py split DIR CORPUS
      Splits each recorded connection into whole PDUs (48-byte BHS, AHS, header digest, data,
      padding, data digest; digests as the login negotiated them, from the first PDU after
      login) and writes seeds in each target's input layout (test/fuzz/src/*.rs) under
      CORPUS/<target>/, named by content hash, small and deduplicated.

Only the standard library: no tcpdump, no privileges.
"""

import hashlib
import os
import socket
import struct
import sys
import threading

BHS = 48

# ---- CRC32C (Castagnoli), as riser's digests --------------------------------------------

_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def wire(crc):
    return struct.pack("<I", crc)


assert crc32c(bytes(32)) == 0x8A9136AA


# ---- proxy -------------------------------------------------------------------------------


def proxy(listen_port, target_port, out):
    os.makedirs(out, exist_ok=True)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen_port))
    srv.listen(64)
    n = 0
    while True:
        client, _ = srv.accept()
        n += 1
        try:
            target = socket.create_connection(("127.0.0.1", target_port))
        except OSError:
            client.close()
            continue
        base = os.path.join(out, "%04d" % n)
        for src, dst, suffix in ((client, target, "i2t"), (target, client, "t2i")):
            threading.Thread(target=relay, args=(src, dst, base + "." + suffix), daemon=True).start()


def relay(src, dst, path):
    with open(path, "ab") as f:
        while True:
            try:
                b = src.recv(65536)
            except OSError:
                b = b""
            if not b:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            f.write(b)
            f.flush()
            try:
                dst.sendall(b)
            except OSError:
                return


# ---- PDUs --------------------------------------------------------------------------------


class Pdu:
    def __init__(self, bhs, ahs, data):
        self.bhs, self.ahs, self.data = bhs, ahs, data

    @property
    def opcode(self):
        return self.bhs[0] & 0x3F

    @property
    def itt(self):
        return struct.unpack(">I", self.bhs[16:20])[0]

    def message(self):
        """iSER message form: BHS, AHS, data, no padding."""
        return self.bhs + self.ahs + self.data

    def tcp(self, hd=False, dd=False):
        out = self.bhs + self.ahs
        if hd:
            out += wire(crc32c(out))
        if self.data:
            padded = self.data + bytes(-len(self.data) % 4)
            out += padded
            if dd:
                out += wire(crc32c(padded))
        return out


def split(stream, hd, dd, login_op):
    """PDUs of one direction. Digests apply from the first PDU that is not login_op."""
    pdus, pos, ffp = [], 0, False
    while pos + BHS <= len(stream):
        bhs = stream[pos:pos + BHS]
        if bhs[0] & 0x3F != login_op:
            ffp = True
        h, d = (hd, dd) if ffp else (False, False)
        ahs_len = bhs[4] * 4
        dsl = int.from_bytes(bhs[5:8], "big")
        head = BHS + ahs_len + (4 if h else 0)
        body = 0 if dsl == 0 else (dsl + (-dsl % 4) + (4 if d else 0))
        if pos + head + body > len(stream):
            break
        ahs = stream[pos + BHS:pos + BHS + ahs_len]
        data = stream[pos + head:pos + head + dsl]
        pdus.append((Pdu(bhs, ahs, data), ffp, stream[pos:pos + head + body]))
        pos += head + body
    return pdus


def pairs(data):
    out = []
    for item in data.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            out.append((k, v))
    return out


def digests_of(t2i_stream):
    """HeaderDigest / DataDigest as the target's Login Responses answered them."""
    hd = dd = False
    for pdu, _, _ in split(t2i_stream, False, False, 0x23):
        if pdu.opcode != 0x23:
            break
        for k, v in pairs(pdu.data):
            if k == b"HeaderDigest":
                hd = v == b"CRC32C"
            elif k == b"DataDigest":
                dd = v == b"CRC32C"
    return hd, dd


# ---- seeds -------------------------------------------------------------------------------


class Corpus:
    def __init__(self, root):
        self.root = root
        self.count = {}
        self.kinds = {}

    def add(self, target, data, cap=None, kind=None, per_kind=3):
        """Adds a seed unless `target` has `cap` new seeds already or `per_kind` of the
        same `kind` (a shape: opcode, key names...)."""
        if cap is not None and self.count.get(target, 0) >= cap:
            return
        if kind is not None:
            k = (target, kind)
            if self.kinds.get(k, 0) >= per_kind:
                return
            self.kinds[k] = self.kinds.get(k, 0) + 1
        d = os.path.join(self.root, target)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, hashlib.sha1(data).hexdigest()[:16])
        if os.path.exists(path):
            return
        with open(path, "wb") as f:
            f.write(data)
        self.count[target] = self.count.get(target, 0) + 1


def login_mode(login_pdus):
    """The login harness's mode byte for a recorded login: CHAP required (mutual when the
    initiator sent CHAP_C), CHAP in discovery too, or no authentication."""
    keys = {k for p in login_pdus for k, _ in pairs(p.data)}
    discovery = any(k == b"SessionType" and v == b"Discovery" for p in login_pdus for k, v in pairs(p.data))
    if b"CHAP_A" not in keys:
        return 3
    if discovery:
        return 0x04 | 3
    return 1 if b"CHAP_C" in keys else 0


def placeholder_chap(pdu):
    """The recorded CHAP_R answered a random challenge; the harness fills in the right one."""
    items = pdu.data.split(b"\0")
    items = [b"CHAP_R=*" if i.startswith(b"CHAP_R=") else i for i in items]
    data = b"\0".join(items)
    bhs = bytearray(pdu.bhs)
    bhs[5:8] = len(data).to_bytes(3, "big")
    return Pdu(bytes(bhs), pdu.ahs, data)


def session_modes(i2t_login, t2i_login, hd, dd):
    """The session harness's two mode bytes for what this login negotiated."""
    ik = {k: v for p in i2t_login for k, v in pairs(p.data)}
    tk = {k: v for p in t2i_login for k, v in pairs(p.data)}

    def idx(table, value, default=0):
        try:
            return table.index(int(value))
        except (TypeError, ValueError):
            return default

    mrdsl = [8192, 512, 65536, 262144]
    burst = [262144, 4096, 65536, 1 << 20]
    m0 = (1 if hd else 0) | (2 if dd else 0)
    m0 |= idx(mrdsl, ik.get(b"MaxRecvDataSegmentLength", 8192)) << 2
    m0 |= idx(mrdsl, tk.get(b"MaxRecvDataSegmentLength", 8192)) << 4
    m0 |= idx(burst, tk.get(b"MaxBurstLength", ik.get(b"MaxBurstLength", 262144))) << 6
    m1 = 0  # MaxOutstandingR2T 1, queue depth 64
    if tk.get(b"ImmediateData", ik.get(b"ImmediateData", b"Yes")) == b"Yes":
        m1 |= 0x10
    if tk.get(b"InitialR2T", ik.get(b"InitialR2T", b"Yes")) == b"Yes":
        m1 |= 0x20
    if ik.get(b"SessionType") == b"Discovery":
        m1 |= 0x40
    return bytes([m0, m1])


ATTR = {0: 3, 1: 0, 2: 1, 3: 2}  # iSCSI ATTR -> harness bits 5-6 (untagged, simple, ordered, HoQ)


def scsi_seed(i2t):
    """One scsi_cdb input from a connection's SCSI Commands and their Data-Out."""
    data_out = {}
    for p in i2t:
        if p.opcode == 0x05:
            off = struct.unpack(">I", p.bhs[40:44])[0]
            data_out.setdefault(p.itt, []).append((off, p.data))
    out = bytearray([0])
    n = 0
    for p in i2t:
        if p.opcode != 0x01:
            continue
        flags = p.bhs[1]
        read, write, attr = flags & 0x40, flags & 0x20, flags & 7
        cdb = p.bhs[32:48]
        dout = p.data
        for _, d in sorted(data_out.get(p.itt, [])):
            dout += d
        dout = dout[:1024]
        edtl = struct.unpack(">I", p.bhs[20:24])[0]
        ctl = 0x80 | (2 if read else 0) | (4 if write else 0) | (ATTR.get(attr, 0) << 5)
        out += bytes([ctl, 16]) + cdb + struct.pack(">IH", edtl, len(dout)) + dout
        n += 1
        if n >= 48 or len(out) > 6144:
            break
    return bytes(out) if n else None


def split_all(rec, corpus_root):
    c = Corpus(corpus_root)
    names = sorted({f.rsplit(".", 1)[0] for f in os.listdir(rec) if f.endswith(".i2t")})
    for name in names:
        i2t_raw = open(os.path.join(rec, name + ".i2t"), "rb").read()
        try:
            t2i_raw = open(os.path.join(rec, name + ".t2i"), "rb").read()
        except FileNotFoundError:
            t2i_raw = b""
        hd, dd = digests_of(t2i_raw)
        i2t = split(i2t_raw, hd, dd, 0x03)
        t2i = split(t2i_raw, hd, dd, 0x23)
        login = [p for p, ffp, _ in i2t if not ffp]
        ffp_frames = [raw for _, ffp, raw in i2t if ffp]
        ffp_pdus = [p for p, ffp, _ in i2t if ffp]

        # login: the login phase as the initiator sent it, CHAP_R left to the harness.
        if login:
            mode = login_mode(login)
            stream = b"".join(placeholder_chap(p).tcp() for p in login)
            shape = (mode, tuple(k for p in login for k, _ in pairs(p.data)))
            c.add("login", bytes([mode]) + stream, kind=shape, per_kind=2)
            if mode != 3:
                # The recorded (now wrong) response too: the failure path.
                c.add("login", bytes([mode]) + b"".join(p.tcp() for p in login), kind=("wrong",) + shape, per_kind=1)

        # framer: the login stream at login limits; the full-feature stream as negotiated
        # (mode: digest bits, 262144-byte limit), and re-encoded with both digests.
        if login:
            c.add("framer", bytes([0x00, 0x00]) + upto([p.tcp() for p in login], 8192), kind="login", per_kind=6)
        if ffp_pdus:
            mode = (1 if hd else 0) | (2 if dd else 0)
            c.add("framer", bytes([mode, 0x06]) + upto(ffp_frames, 8192), kind=mode, per_kind=12)
            c.add("framer", bytes([0x03, 0x06]) + upto((p.tcp(True, True) for p in ffp_pdus), 8192), kind="crc", per_kind=12)

        # pdu_codec / iser_header / text: one PDU each, both directions.
        for p in [p for p, _, _ in i2t] + [p for p, _, _ in t2i]:
            if len(p.data) > 8192:
                continue
            c.add("pdu_codec", bytes([0x00]) + p.message(), kind=(p.opcode, len(p.ahs) > 0, len(p.data) > 0), per_kind=4)
            if p.opcode in (0x03, 0x04, 0x23, 0x24) and p.data:
                c.add("text", bytes([0x00]) + p.data, kind=tuple(k for k, _ in pairs(p.data)), per_kind=2)
        # iSER: the same PDUs behind the iSER header the iSER datamover writes.
        for p in ffp_pdus[:8] + login[:2]:
            if len(p.data) > 8192:
                continue
            hdr = bytearray(28)
            hdr[0] = 0x10  # control-type PDU
            if p.opcode == 0x01 and p.bhs[1] & 0x20:  # W: the target RDMA-Reads the data
                hdr[0] |= 0x08
                hdr[4:16] = struct.pack(">IQ", 0x1234, 0x7F0000001000)
            if p.opcode == 0x01 and p.bhs[1] & 0x40:  # R: the target RDMA-Writes it
                hdr[0] |= 0x04
                hdr[16:28] = struct.pack(">IQ", 0x5678, 0x7F0000002000)
            c.add("iser_header", bytes(hdr) + p.message(), kind=(hdr[0], p.opcode), per_kind=3)

        # session: the full-feature stream with the connection's negotiated parameters.
        if ffp_frames:
            t2i_login = [p for p, ffp, _ in t2i if not ffp]
            modes = session_modes(login, t2i_login, hd, dd)
            c.add("session", modes + upto(ffp_frames, 12288), kind=modes, per_kind=12)

        # scsi_cdb: the connection's commands in order.
        s = scsi_seed(ffp_pdus)
        if s:
            c.add("scsi_cdb", s, cap=40)

    # iSER Hello and HelloReply (RFC 7145 §9.2, §9.3): never on IB/RoCE, still parsed.
    c.add("iser_header", bytes([0x20, 0x10, 0x00, 0x10]) + bytes(24))
    c.add("iser_header", bytes([0x30, 0x11, 0x00, 0x10]) + bytes(24))
    for t, n in sorted(c.count.items()):
        print("%-12s %d new seeds" % (t, n))


def upto(frames, limit):
    """The first whole PDUs of a stream, at most `limit` bytes (larger PDUs left out)."""
    out = b""
    for f in frames:
        if len(f) > limit:
            continue
        if len(out) + len(f) > limit:
            break
        out += f
    return out


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "proxy":
        proxy(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == "split":
        split_all(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
