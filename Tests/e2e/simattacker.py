"""A hand-rolled central on the simulated radio (the SocketAir wire: 4-byte length + JSON) that
speaks just enough Boxkey protocol 5 to open authenticated links with its own keys: Noise IK
message 1 (Noise_IK_25519_ChaChaPoly_BLAKE2b), then it stays silent. Any address it likes."""
import glob
import hashlib
import hmac
import json
import os
import socket
import struct
import threading
import time

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives import serialization

SERVICE = "ea000001-caf9-4a51-a017-a07d06dfeed4"
INFO = "ea000002-caf9-4a51-a017-a07d06dfeed4"
REQUEST = "ea000003-caf9-4a51-a017-a07d06dfeed4"
RESPONSE = "ea000004-caf9-4a51-a017-a07d06dfeed4"
VERSION = 5


def raw(pub):
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class Key:
    def __init__(self, private=None):
        self.private = private or X25519PrivateKey.generate()
        self.public = raw(self.private.public_key())

    @property
    def hex(self):
        return self.public.hex()


# --- Noise IK initiator, message 1 only --------------------------------------------------------
def _hash(data):
    return hashlib.blake2b(data).digest()


def _hkdf(ck, ikm):
    temp = hmac.new(ck, ikm, hashlib.blake2b).digest()
    o1 = hmac.new(temp, b"\x01", hashlib.blake2b).digest()
    o2 = hmac.new(temp, o1 + b"\x02", hashlib.blake2b).digest()
    return o1, o2


class Symmetric:
    def __init__(self, name):
        self.h = name.ljust(64, b"\0") if len(name) <= 64 else _hash(name)
        self.ck = self.h
        self.k = None
        self.n = 0

    def mix_hash(self, data):
        self.h = _hash(self.h + data)

    def mix_key(self, ikm):
        self.ck, temp = _hkdf(self.ck, ikm)
        self.k, self.n = temp[:32], 0

    def encrypt_and_hash(self, plaintext):
        nonce = b"\0\0\0\0" + struct.pack("<Q", self.n)
        c = ChaCha20Poly1305(self.k).encrypt(nonce, plaintext, self.h)
        self.n += 1
        self.mix_hash(c)
        return c


def message1(s: Key, box_key: bytes, prologue: bytes):
    sym = Symmetric(b"Noise_IK_25519_ChaChaPoly_BLAKE2b")
    sym.mix_hash(prologue)
    sym.mix_hash(box_key)
    rs = X25519PublicKey.from_public_bytes(box_key)
    e = X25519PrivateKey.generate()
    e_pub = raw(e.public_key())
    sym.mix_hash(e_pub)
    sym.mix_key(e.exchange(rs))
    enc_s = sym.encrypt_and_hash(s.public)
    sym.mix_key(s.private.exchange(rs))
    payload = sym.encrypt_and_hash(b"")
    return e_pub + enc_s + payload


# --- the simulated air --------------------------------------------------------------------------
def box(sim_dir):
    """(socket path, box ID, box static key, nonce) of the box advertising in sim_dir."""
    for path in glob.glob(os.path.join(sim_dir, "*.json")):
        f = json.load(open(path))
        if not f.get("service") or f["service"]["uuid"] != SERVICE or not f.get("advertising"):
            continue
        md = f["advertising"]["manufacturerData"]
        payload = bytes(md[1]) if isinstance(md, list) else bytes(list(md.values())[0])
        info = next(c["value"] for c in f["service"]["characteristics"] if c["uuid"] == INFO)
        box_id = struct.unpack(">H", bytes(info[2:4]))[0]
        key = bytes(info[4:36])
        nonce = struct.unpack(">H", payload[3:5])[0]
        return path[:-5] + ".sock", box_id, key, nonce
    raise RuntimeError("no box advertising in " + sim_dir)


def prologue(box_id, nonce):
    return b"BOXKEY" + bytes([VERSION]) + struct.pack(">HH", box_id, nonce)


class Link:
    """One connection to the box from `address`."""

    def __init__(self, sim_dir, address, mtu=185):
        self.sim_dir, self.address, self.mtu = sim_dir, address, mtu
        self.sock_path, self.box_id, self.box_key, self.nonce = box(sim_dir)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.sock_path)
        self.closed = threading.Event()
        self.notifications = []
        self._send({"hello": {"central": address, "trajectory": {"from": 1, "to": 1, "start": [0, 0], "duration": [0, 0]}}})
        self._event({"connected": {"mtu": mtu}})
        threading.Thread(target=self._read, daemon=True).start()

    def _send(self, frame):
        data = json.dumps(frame).encode()
        try:
            self.sock.sendall(struct.pack(">I", len(data)) + data)
        except OSError:
            self.closed.set()

    def _event(self, wire):
        self._send({"event": {"_0": wire, "time": time.monotonic_ns(), "waitsForClock": False}})

    def _read(self):
        buf = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 4:
                    n = struct.unpack(">I", buf[:4])[0]
                    if len(buf) < 4 + n:
                        break
                    frame = json.loads(buf[4:4 + n])
                    buf = buf[4 + n:]
                    if "disconnect" in frame:
                        self.closed.set()
                        return
                    if "notify" in frame:
                        self.notifications.append(bytes(frame["notify"]["value"]))
        except OSError:
            pass
        self.closed.set()

    def handshake(self, key: Key, channel=None):
        """Writes HandshakeInit for `key` (one fragment) and returns the box's first reply
        envelope, or None if it hung up first."""
        channel = channel if channel is not None else os.urandom(4)
        self._event({"subscribed": {"_0": RESPONSE}})
        m1 = message1(key, self.box_key, prologue(self.box_id, self.nonce))
        envelope = bytes([VERSION, 0x01]) + struct.pack(">H", self.nonce) + m1
        fragment = channel + b"\0" + struct.pack(">H", len(envelope)) + envelope
        self._event({"wrote": {"characteristic": REQUEST, "value": list(fragment), "mtu": self.mtu}})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not self.notifications and not self.closed.is_set():
            time.sleep(0.01)
        if not self.notifications:
            return None
        f = self.notifications[0]
        return f[7:]  # channel (4) | index (1) | length (2) | envelope

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
        self.closed.set()
