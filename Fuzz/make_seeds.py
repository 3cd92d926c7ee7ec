"""Writes the committed seed corpus (run once; needs noiseprotocol). Seeds are valid inputs
for each target, so the fuzzer starts past the length checks."""
import os
from noise.connection import NoiseConnection, Keypair

here = os.path.dirname(os.path.abspath(__file__))
VERSION = 2
prologue = b"BOXKEY" + bytes([VERSION, 0x12, 0xD5, 0xBE, 0xEF])
box_priv = bytes([0x11]) * 32
phone_priv = bytes([0x22]) * 32


def box_public():
    c = NoiseConnection.from_name(b"Noise_IK_25519_ChaChaPoly_BLAKE2b")
    c.set_as_responder()
    c.set_keypair_from_private_bytes(Keypair.STATIC, box_priv)
    return c.noise_protocol.keypairs["s"].public_bytes


def message1(seed):
    c = NoiseConnection.from_name(b"Noise_IK_25519_ChaChaPoly_BLAKE2b")
    c.set_as_initiator()
    c.set_prologue(prologue)
    c.set_keypair_from_private_bytes(Keypair.STATIC, phone_priv)
    c.set_keypair_from_private_bytes(Keypair.EPHEMERAL, bytes([seed]) * 32)
    c.set_keypair_from_public_bytes(Keypair.REMOTE_STATIC, box_public())
    c.start_handshake()
    return bytes([VERSION, 1, 0xBE, 0xEF]) + c.write_message()


def fragments(message, mtu):
    cap = mtu - 3
    out, i, off = [], 0, 0
    while off < len(message):
        head = bytes([i]) + (len(message).to_bytes(2, "big") if i == 0 else b"")
        take = cap - len(head)
        out.append(head + message[off:off + take])
        off += take
        i += 1
    return out


def write(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


m1 = message1(0x33)
for mtu in (23, 185, 250):
    write("fragments", f"handshake-mtu{mtu}", bytes([(mtu - 23) % 256]) + b"".join(bytes([len(f)]) + f for f in fragments(m1, mtu)))
write("handshake", "message1", len(m1).to_bytes(2, "big") + m1)
# A pairing init: the same Noise message 1 shape after a 32-byte CPace share.
pairing = bytes([VERSION, 5, 0xBE, 0xEF]) + bytes(range(1, 33)) + m1[4:]
write("handshake", "pairing-init", len(pairing).to_bytes(2, "big") + pairing)
sealed = bytes([VERSION, 3]) + bytes(range(40))
write("handshake", "message1-then-sealed", len(m1).to_bytes(2, "big") + m1 + len(sealed).to_bytes(2, "big") + sealed)
write("messages", "push", bytes([1, 5]) + b"alice" + bytes([0, 13]) + b"correct horse" + bytes([5]) + b"pixel")
write("messages", "result", bytes([2, 1, 22]) + b"Authentication failure")
write("messages", "action", bytes([6, 1, 0]))
write("messages", "error", bytes([8, 1, 2]) + b"no")
write("messages", "advert", bytes([0x21, 0x12, 0xD5, 0xBE, 0xEF, 0x42]))
write("messages", "refusal", bytes([VERSION, 4, 2, VERSION, VERSION]))
write("messages", "envelope-m2", bytes([VERSION, 2]) + bytes(48))
# Pairing envelopes: nonce + CPace share + IKpsk2 message 1, and share + message 2.
write("messages", "envelope-pairing-init", bytes([VERSION, 5, 0xBE, 0xEF]) + bytes(range(32)) + bytes(96))
write("messages", "envelope-pairing-response", bytes([VERSION, 6]) + bytes(range(32)) + bytes(48))
write("messages", "pair", bytes([0x0a]))
